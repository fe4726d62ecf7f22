"""Communication cost to reach accuracy levels (seed 004 Tables 6.4-6.7, seed 001 Table 6).

For every run and accuracy level: the cumulative traffic (upload + download, MiB = 2**20
bytes) up to the first round whose accuracy reaches the level, and the saving against a
baseline run (FedAvg) at the same level, 1 - cost_run / cost_baseline. A level a run never
reaches is marked "+" as in seed 004. The average saving is over the levels both runs reach
(the "Avg" row of Tables 6.4-6.7).

Which accuracy (``accuracy``):

* ``"mean"`` (default, seed 004 §6.1.5 "Mean accuracy of the last L-rounds"): the ACC a level
  is compared with is the mean test accuracy of the last ``window`` evaluated rounds (30 in the
  paper) up to and including the round; in a run's first ``window - 1`` evaluated rounds it is
  the mean of those evaluated so far (a shorter window at the start, never a later round's);
* ``"round"``: the round's own test accuracy (seed 001 Table 6: "to reach a target test
  accuracy").

Pure functions over plain data: a run is a name and its per-round records, each a
``(round, accuracy, cum_upload_bytes, cum_download_bytes)`` tuple or a mapping with those
keys (``RoundRecord.to_dict()``). Accuracies and levels share one unit (fractions in fedapt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedcore.payload import mib

NOT_REACHED = "+"  # seed 004's mark for a level the run never reached
ACC_WINDOW = 30  # seed 004 §6.1.5: ACC is the mean accuracy of the last 30 rounds
ACCURACY_KINDS = ("mean", "round")


@dataclass(frozen=True)
class RoundPoint:
    round: int
    accuracy: float | None
    cum_upload_bytes: int
    cum_download_bytes: int

    @property
    def cum_bytes(self) -> int:
        return self.cum_upload_bytes + self.cum_download_bytes


RoundLike = RoundPoint | Sequence[Any] | Mapping[str, Any]


def as_point(r: RoundLike) -> RoundPoint:
    if isinstance(r, RoundPoint):
        return r
    if isinstance(r, Mapping):
        return RoundPoint(
            int(r["round"]), r["accuracy"], int(r["cum_upload_bytes"]), int(r["cum_download_bytes"])
        )
    rnd, acc, up, down = r
    return RoundPoint(int(rnd), acc, int(up), int(down))


def windowed(rounds: Sequence[RoundLike], window: int = ACC_WINDOW) -> list[RoundPoint]:
    """The rounds with each evaluated round's accuracy replaced by ACC, the mean accuracy of
    the last ``window`` evaluated rounds up to it (seed 004 §6.1.5; module docstring)."""
    if window < 1:
        raise ValueError(f"the ACC window is a number of rounds >= 1 (got {window})")
    out, seen = [], []
    for p in map(as_point, rounds):
        if p.accuracy is not None:
            seen.append(float(p.accuracy))
            last = seen[-window:]
            p = RoundPoint(p.round, sum(last) / len(last), p.cum_upload_bytes, p.cum_download_bytes)
        out.append(p)
    return out


def first_reach(rounds: Sequence[RoundLike], level: float) -> RoundPoint | None:
    """The first evaluated round whose accuracy is >= ``level`` (None: never)."""
    for p in map(as_point, rounds):
        if p.accuracy is not None and p.accuracy >= level:
            return p
    return None


def comm_cost_report(
    runs: Mapping[str, Sequence[RoundLike]],
    levels: Sequence[float],
    baseline: str = "fedavg",
    *,
    accuracy: str = "mean",
    window: int = ACC_WINDOW,
) -> dict[str, Any]:
    """JSON-able table: per level, each run's cost to first reach it (its ACC: the mean of the
    last ``window`` evaluated rounds, or with ``accuracy="round"`` the round's own accuracy)
    and its saving."""
    if baseline not in runs:
        raise ValueError(f"baseline run {baseline!r} not among {sorted(runs)}")
    if accuracy not in ACCURACY_KINDS:
        raise ValueError(f"unknown accuracy {accuracy!r}; valid: {', '.join(ACCURACY_KINDS)}")
    raw = runs
    if accuracy == "mean":
        runs = {name: windowed(rounds, window) for name, rounds in runs.items()}
    rows = []
    savings: dict[str, list[float]] = {name: [] for name in runs if name != baseline}
    for level in sorted(levels):
        cost: dict[str, dict[str, Any] | None] = {}
        for name, rounds in runs.items():
            p = first_reach(rounds, level)
            cost[name] = (
                None
                if p is None
                else {
                    "round": p.round,
                    "mib": mib(p.cum_bytes),
                    "upload_mib": mib(p.cum_upload_bytes),
                    "download_mib": mib(p.cum_download_bytes),
                }
            )
        base = cost[baseline]
        saving: dict[str, float | None] = {}
        by_dir: dict[str, dict[str, float | None]] = {}
        for name in savings:
            c = cost[name]
            s = _saving(c, base, "mib")
            saving[name] = s
            by_dir[name] = {d: _saving(c, base, f"{d}_mib") for d in ("upload", "download")}
            if s is not None:
                savings[name].append(s)
        rows.append(
            {"accuracy": level, "cost": cost, "saving": saving, "saving_by_direction": by_dir}
        )
    final = {}
    for name, rounds in raw.items():
        pts = [as_point(r) for r in rounds]
        accs = [p.accuracy for p in pts if p.accuracy is not None]
        final[name] = {
            "rounds": pts[-1].round if pts else 0,
            "best_accuracy": max(accs) if accs else None,
            "mib": mib(pts[-1].cum_bytes) if pts else 0.0,
        }
        if accuracy == "mean":
            acc = [q.accuracy for q in map(as_point, runs[name]) if q.accuracy is not None]
            final[name]["final_acc"] = acc[-1] if acc else None
    return {
        "unit": "MiB",
        "accuracy": accuracy,
        "window": window if accuracy == "mean" else 1,
        "baseline": baseline,
        "runs": list(runs),
        "rows": rows,
        "average_saving": {n: sum(s) / len(s) if s else None for n, s in savings.items()},
        "final": final,
    }


def _saving(c: Mapping[str, Any] | None, base: Mapping[str, Any] | None, key: str) -> float | None:
    if c is None or base is None or base[key] == 0:
        return None
    return 1 - c[key] / base[key]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def phase_report(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str, key: str = "freeze_index"
) -> dict[str, list[dict[str, Any]]]:
    """Per-round traffic by phase (seed 004 Table 6.2, measured): for every run whose rounds
    carry ``extra[key]`` (FedNILO's freezing index), the spans of consecutive rounds with the
    same value, their mean upload and download MiB per round, and the saving of each direction
    against the baseline's mean over the same rounds. Runs without the key are left out."""
    if baseline not in runs:
        raise ValueError(f"baseline run {baseline!r} not among {sorted(runs)}")
    base = {int(r["round"]): r for r in runs[baseline]}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rounds in runs.items():
        if name == baseline or not rounds or any(key not in r.get("extra", {}) for r in rounds):
            continue
        spans: list[list[Mapping[str, Any]]] = []
        for r in rounds:
            if spans and spans[-1][-1]["extra"][key] == r["extra"][key]:
                spans[-1].append(r)
            else:
                spans.append([r])
        phases = []
        for span in spans:
            first, last = int(span[0]["round"]), int(span[-1]["round"])
            row: dict[str, Any] = {
                "rounds": [first, last],
                key: span[0]["extra"][key],
                **{k: v for k, v in span[0]["extra"].items() if k != key},
            }
            same = [base[int(r["round"])] for r in span if int(r["round"]) in base]
            for d in ("upload", "download"):
                run_mib = _mean([mib(r[f"{d}_bytes"]) for r in span])
                base_mib = _mean([mib(r[f"{d}_bytes"]) for r in same]) if same else None
                row[f"{d}_mib_per_round"] = run_mib
                row[f"{baseline}_{d}_mib_per_round"] = base_mib
                row[f"{d}_saving"] = 1 - run_mib / base_mib if base_mib else None
            phases.append(row)
        out[name] = phases
    return out


def key_of(row: Mapping[str, Any]) -> str:
    return "freeze_index" if "freeze_index" in row else ""


def _num(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return "" if v is None else str(v)


def direction_markdown(report: Mapping[str, Any]) -> str:
    """Upload and download apart for ``comm_cost_report``: cumulative MiB of each direction
    to first reach each level, and each direction's saving against the baseline."""
    names, base = report["runs"], report["baseline"]
    others = [n for n in names if n != base]
    head = ["ACC (%)" if report.get("accuracy") == "mean" else "Acc. (%)"]
    for n in names:
        head += [f"{n} up (MiB)", f"{n} down (MiB)"]
    for n in others:
        head += [f"{n} up saving", f"{n} down saving"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        cells = [f"{100 * row['accuracy']:.1f}"]
        for n in names:
            c = row["cost"][n]
            cells += (
                [NOT_REACHED] * 2
                if c is None
                else [f"{c['upload_mib']:.2f}", f"{c['download_mib']:.2f}"]
            )
        for n in others:
            for d in ("upload", "download"):
                v = row["saving_by_direction"][n][d]
                cells.append(NOT_REACHED if v is None else f"{100 * v:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def phase_markdown(phases: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str) -> str:
    """Markdown of ``phase_report``: one table per run."""
    lines: list[str] = []

    def pct(s: float | None) -> str:
        return NOT_REACHED if s is None else f"{100 * s:.1f}%"

    for name, rows in phases.items():
        lines += [
            f"Per-round traffic by phase, {name} against {baseline} (MiB per round):",
            "",
            "| rounds | freeze index | upload | download | "
            f"{baseline} upload | {baseline} download | upload saving | download saving |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            a, b = r["rounds"]
            base_up, base_down = (
                r[f"{baseline}_upload_mib_per_round"],
                r[f"{baseline}_download_mib_per_round"],
            )
            cells = [
                f"{a}-{b}" if a != b else f"{a}",
                _num(r.get(key_of(r))),
                f"{r['upload_mib_per_round']:.3f}",
                f"{r['download_mib_per_round']:.3f}",
                "" if base_up is None else f"{base_up:.3f}",
                "" if base_down is None else f"{base_down:.3f}",
                pct(r["upload_saving"]),
                pct(r["download_saving"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def comm_cost_markdown(report: Mapping[str, Any], style: str = "seed004") -> str:
    """Markdown of ``comm_cost_report``: "seed004" cells are cumulative MiB (Tables 6.4-6.7),
    "seed001" cells are rounds x mean MiB per round (seed 001 Table 6)."""
    if style not in ("seed004", "seed001"):
        raise ValueError(f"unknown style {style!r}; valid: seed001, seed004")
    names, base = report["runs"], report["baseline"]
    others = [n for n in names if n != base]
    mean = report.get("accuracy") == "mean"
    acc_head = "ACC (%)" if mean else "Acc. (%)"
    head = [acc_head, *(f"{n} (MiB)" for n in names), *(f"{n} saving" for n in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(c: Mapping[str, Any] | None) -> str:
        if c is None:
            return NOT_REACHED
        if style == "seed001":
            return f"{c['round']} × {c['mib'] / c['round']:.2f}"
        return f"{c['mib']:.2f}"

    def pct(s: float | None) -> str:
        return NOT_REACHED if s is None else f"{100 * s:.1f}%"

    for row in report["rows"]:
        cells = [f"{100 * row['accuracy']:.1f}", *(cell(row["cost"][n]) for n in names)]
        cells += [pct(row["saving"][n]) for n in others]
        lines.append("| " + " | ".join(cells) + " |")
    avg = ["Avg", *([""] * len(names)), *(pct(report["average_saving"][n]) for n in others)]
    lines.append("| " + " | ".join(avg) + " |")
    lines.append("")
    lines.append(f"{NOT_REACHED}: level not reached. Saving: 1 - cost / cost of {base}.")
    if mean:
        lines.append(
            f"ACC: mean test accuracy of the last {report['window']} evaluated rounds, fewer "
            "at the start (seed 004 §6.1.5)."
        )
    return "\n".join(lines) + "\n"


def target_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """Per run, the MiB to first reach the *target*: the highest accuracy level the baseline
    reaches (the level rows of ``comm_cost_report``), its saving, and the run's final ACC
    and total MiB. The target is None when the baseline reaches no level."""
    base = report["baseline"]
    reached = [row for row in report["rows"] if row["cost"][base] is not None]
    target = reached[-1] if reached else None
    runs = {}
    for name in report["runs"]:
        final = report["final"][name]
        cost = None if target is None else target["cost"][name]
        runs[name] = {
            "mib": None if cost is None else cost["mib"],
            "upload_mib": None if cost is None else cost["upload_mib"],
            "download_mib": None if cost is None else cost["download_mib"],
            "round": None if cost is None else cost["round"],
            "saving": None if target is None or name == base else target["saving"][name],
            "final_acc": final.get("final_acc", final["best_accuracy"]),
            "total_mib": final["mib"],
        }
    return {"target": None if target is None else target["accuracy"], "runs": runs}


def target_markdown(
    target: Mapping[str, Any], baseline: str, columns: Mapping[str, Mapping[str, str]]
) -> str:
    """Markdown of ``target_report``: one row per run with its ``columns`` (e.g. adapter and
    codec), MiB up, down and total to reach the target, the saving and the final ACC."""
    level = target["target"]
    if level is None:
        return f"The baseline {baseline} reaches none of the accuracy levels: no target.\n"
    keys = sorted({k for c in columns.values() for k in c}, key=["adapter", "codec"].index)
    head = ["run", *keys, "up MiB", "down MiB", "MiB to target", "saving", "final ACC (%)"]
    lines = [
        f"MiB to reach the target, {100 * level:.1f}% (the highest level {baseline} reaches):",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---|" * len(keys) + "--:|" * 5,
    ]

    def num(x: float | None, fmt: str) -> str:
        return NOT_REACHED if x is None else format(x, fmt)

    for name, r in target["runs"].items():
        saving = "-" if name == baseline else num(r["saving"] and 100 * r["saving"], ".1f")
        row = [name, *(columns.get(name, {}).get(k, "") for k in keys)]
        row += [num(r["upload_mib"], ".2f"), num(r["download_mib"], ".2f"), num(r["mib"], ".2f")]
        row += [saving + ("%" if saving not in ("-", NOT_REACHED) else ""),
                num(r["final_acc"] and 100 * r["final_acc"], ".2f")]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
