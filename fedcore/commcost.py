"""Communication cost to reach accuracy levels (seed 004 Tables 6.4-6.7, seed 001 Table 6).

For every run and accuracy level: the cumulative traffic (upload + download, MiB = 2**20
bytes) up to the first round whose test accuracy reaches the level, and the saving against a
baseline run (FedAvg) at the same level, 1 - cost_run / cost_baseline. A level a run never
reaches is marked "+" as in seed 004. The average saving is over the levels both runs reach
(the "Avg" row of Tables 6.4-6.7).

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


def first_reach(rounds: Sequence[RoundLike], level: float) -> RoundPoint | None:
    """The first evaluated round whose accuracy is >= ``level`` (None: never)."""
    for p in map(as_point, rounds):
        if p.accuracy is not None and p.accuracy >= level:
            return p
    return None


def comm_cost_report(
    runs: Mapping[str, Sequence[RoundLike]], levels: Sequence[float], baseline: str = "fedavg"
) -> dict[str, Any]:
    """JSON-able table: per level, each run's cost to first reach it and its saving."""
    if baseline not in runs:
        raise ValueError(f"baseline run {baseline!r} not among {sorted(runs)}")
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
        for name in savings:
            c = cost[name]
            s = (
                None
                if c is None or base is None or base["mib"] == 0
                else 1 - c["mib"] / base["mib"]
            )
            saving[name] = s
            if s is not None:
                savings[name].append(s)
        rows.append({"accuracy": level, "cost": cost, "saving": saving})
    final = {}
    for name, rounds in runs.items():
        pts = [as_point(r) for r in rounds]
        accs = [p.accuracy for p in pts if p.accuracy is not None]
        final[name] = {
            "rounds": pts[-1].round if pts else 0,
            "best_accuracy": max(accs) if accs else None,
            "mib": mib(pts[-1].cum_bytes) if pts else 0.0,
        }
    return {
        "unit": "MiB",
        "baseline": baseline,
        "runs": list(runs),
        "rows": rows,
        "average_saving": {n: sum(s) / len(s) if s else None for n, s in savings.items()},
        "final": final,
    }


def comm_cost_markdown(report: Mapping[str, Any], style: str = "seed004") -> str:
    """Markdown of ``comm_cost_report``: "seed004" cells are cumulative MiB (Tables 6.4-6.7),
    "seed001" cells are rounds x mean MiB per round (seed 001 Table 6)."""
    if style not in ("seed004", "seed001"):
        raise ValueError(f"unknown style {style!r}; valid: seed001, seed004")
    names, base = report["runs"], report["baseline"]
    others = [n for n in names if n != base]
    head = ["Acc. (%)", *(f"{n} (MiB)" for n in names), *(f"{n} saving" for n in others)]
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
    return "\n".join(lines) + "\n"
