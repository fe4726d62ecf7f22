"""reproduction.md and its figures: for each claim the paper's numbers, what fedapt ran
under the profile (and what was scaled, why), fedapt's numbers and whether the direction
holds; then every experiment with its status and time. Figures first, the report last, each
file written atomically, so a reader never sees a report pointing at a missing figure."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedcore import numerics
from tasks.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tasks.reproduce import records
from tasks.reproduce.registry import unmet
from tasks.reproduce.runs import FIGURES, REPORT, Planned, status
from tasks.reproduce.spec import Claim, ExperimentResult, Results, Verdict
from tasks.reproduce.verdict import decide
from tasks.results.figures import save_png

RECORDS_HINT = "records/<experiment>.json"
SMOKE = (
    "> **Smoke test, not a reproduction.** The `ci` profile runs every claim's pipeline end "
    "to end on tiny subsets for one to three rounds so that it cannot rot. Its numbers and "
    'its "holds" column say nothing about the papers; run `--profile cpu` (about two '
    "hours on 2 cores) or `--profile gpu` (the seeds' protocols) for that."
)


UNDECIDED = ("not ", "refused")


def label(v: Verdict, profile: str) -> str:
    """The verdict in words: holds, does not hold, cannot say; a claim with no verdict yet
    (not run, refused, not available) says so rather than "cannot say"."""
    word = {True: "holds", False: "does not hold", None: "cannot say"}[v.holds]
    if v.holds is None and v.text.startswith(UNDECIDED):
        word = v.text.split(":", 1)[0].split(" (", 1)[0]
    return f"{word} (smoke test)" if profile == "ci" else word


def verdicts(
    claims: Sequence[Claim], items: Sequence[Planned], results: Results, profile: str
) -> dict[str, Verdict]:
    """Each claim's verdict from the finished results of the experiments it has under the
    profile (``items``), over their seeds (pure)."""
    out = {}
    for claim in claims:
        if missing := unmet(claim):
            out[claim.id] = Verdict(
                None, "not available in this build: needs " + ", ".join(missing)
            )
            continue
        needs = [it.experiment.name for it in items if it.experiment.name in claim.needs_all()]
        out[claim.id] = decide(claim, results, needs, claim.seeds_needed(profile))
    return out


def write_figures(claims: Sequence[Claim], results: Results, root: Path) -> dict[str, Path]:
    """figures/<claim>.png for every claim with something to draw."""
    out = {}
    for claim in claims:
        if claim.plot is None or unmet(claim):
            continue
        names = set(claim.needs_all())
        fig = claim.plot({k: v for k, v in results.items() if k in names})
        if fig is not None:
            fig.suptitle(f"{claim.id}: {claim.source}", fontsize=9)
            out[claim.id] = atomic_write_bytes(root / FIGURES / f"{claim.id}.png", save_png(fig))
    return out


def cells_table(name: str, result: ExperimentResult, window: int = 5) -> str:
    """One experiment's cells: the end level (mean test accuracy of the last ``window``
    evaluations, %, what the verdicts read) and MiB per round, mean ± std over seeds."""
    from tasks.reproduce.measures import end_level, mib_per_round
    from tasks.reproduce.verdict import mean_std

    rows = [
        f"| `{name}` cell | acc % (last {window} evaluations) | MiB/round | seeds |",
        "|---|--:|--:|--:|",
    ]
    cells = sorted({c for per in result.runs.values() for c in per})
    for c in cells:
        got = [result.runs[s][c] for s in result.seeds if c in result.runs[s]]
        accs = [end_level(x, window) for x in got]
        mib = [mib_per_round(x) if "upload_bytes_per_round" in x.record else None for x in got]
        rows.append(
            f"| {c} | {mean_std([None if a is None else 100 * a for a in accs])} "
            f"| {mean_std(mib, '.3f')} | {len(got)} |"
        )
    return "\n".join(rows)


def tuning_table(items: Sequence[Planned], experiment: str) -> str:
    """What was tuned for ``experiment`` and how: per cell, each lr's mean validation accuracy
    over the last L rounds, the chosen one in bold; empty when it was not tuned."""
    from tasks.reproduce.runs import chosen_lrs, tuning_scores

    probes = [it for it in items if it.tunes == experiment]
    if not probes:
        return ""
    p = probes[0].params
    which = (
        "server lr of each server optimiser"
        if probes[0].tried != p.client.lr
        else ("client lr of each cell")
    )
    head = (
        f"**Tuning of `{experiment}`.** The {which} is the best of "
        f"{', '.join(f'{it.tried:g}' for it in probes)} by the mean validation "
        f"accuracy over the last {p.federation.last_rounds} rounds of a seed-0 run on the "
        f"training rows less a held-out {100 * p.data.validation:g}% (never the test set); "
        "the experiment then trains on the same rows."
    )
    scores = tuning_scores(probes)
    if scores is None:
        return head + " Not finished yet."
    cells = sorted({c for per in scores.values() for c in per})
    lrs = sorted(scores)
    best = chosen_lrs(probes) or {}
    rows = ["| cell | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |"]
    rows.append("|---|" + "--:|" * len(lrs))
    for c in cells:
        vals = []
        for lr in lrs:
            acc = scores[lr].get(c)
            text = "-" if acc is None else f"{100 * acc:.2f}"
            vals.append(f"**{text}**" if lr == best.get(c) else text)
        rows.append(f"| {c} | " + " | ".join(vals) + " |")
    return head + "\n\n" + "\n".join(rows)


def _minutes(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) / 60:.1f}"


def _experiments_table(items: Sequence[Planned]) -> tuple[str, float]:
    rows = [
        "| experiment | claim | cells | seeds | status | minutes | computed by |",
        "|---|---|---|---|---|--:|---|",
    ]
    total = 0.0
    for item in items:
        rec = records.read_record(item.record) or {}
        done = (st := status(item)) == "done"
        extra = sum(float(r.get("seconds") or 0) for r in rec.get("seed_runs", []))
        seconds = float(rec.get("seconds") or 0) + extra if done else None
        total += float(seconds or 0)
        g = item.params.grid
        cells = ", ".join(f"{a}-{d}" for a in g.algorithms for d in g.adapters)
        if done:
            seeds = ", ".join(sorted(rec.get("seeds", {}), key=int))
        else:
            p = item.params.experiment
            seeds = ", ".join(map(str, p.seeds or [p.seed]))
        by = rec.get("computed_by") or {}
        who = ""
        if done and by:
            commit = str(by.get("commit") or "?")[:10]
            who = (
                f"{commit}{'' if by.get('clean') else ' (dirty)'}, code {rec.get('code')}, "
                f"{by.get('cpu')}, {by.get('numerics')}"
                + (", resumed" if rec.get("resumed") else "")
            )
        rows.append(
            f"| `{item.params.experiment.name}` | {item.claim.id} | {cells} | {seeds} | {st} | "
            f"{_minutes(seconds)} | {who} |"
        )
    return "\n".join(rows), total


def _revalidated(item: Planned) -> str:
    """Where an experiment's numbers come from an older code version that this one reproduced
    (``--revalidate``: one whole seed rerun, identical): the codes and what was checked."""
    rec = records.read_record(item.record) or {}
    checks = rec.get("revalidated") or []
    if not checks:
        return ""
    first, last = checks[0], checks[-1]
    if first["from"] == last["to"]:
        return (
            f"; seed {last['seed']} rerun whole at its code {last['to']} by a second process, "
            "every value identical"
        )
    return (
        f"; computed by code {first['from']}, revalidated at {last['to']}: seed "
        f"{last['seed']} rerun whole, every value identical"
    )


def _dropped(claim: Claim) -> list[str]:
    """The designs dropped after probes, as sensitivity rows."""
    if not claim.dropped:
        return []
    rows = [
        "**Designs tried and dropped before the committed runs** (sensitivity: what the "
        "verdict would have stood on instead):",
        "",
        "| design | measured | why dropped |",
        "|---|---|---|",
        *(f"| {d.design} | {d.measured} | {d.why} |" for d in claim.dropped),
        "",
    ]
    return rows


def counts(decided: Mapping[str, Verdict]) -> str:
    """How many claims are decided (holds or does not hold), and how the rest stand."""
    vs = list(decided.values())
    holds = sum(v.holds is True for v in vs)
    fails = sum(v.holds is False for v in vs)
    unrun = sum(v.holds is None and v.text.startswith(UNDECIDED) for v in vs)
    cannot = len(vs) - holds - fails - unrun
    return (
        f"{holds + fails} of {len(vs)} claims decided ({holds} hold, {fails} do not hold); "
        f"{cannot} cannot say; {unrun} not run, not available or refused."
    )


def markdown(
    profile: str,
    claims: Sequence[Claim],
    items: Sequence[Planned],
    results: Results,
    decided: Mapping[str, Verdict],
    figures: Mapping[str, Path],
    command: str,
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    )
    modes = sorted({it.params.runtime.numerics for it in items}) or [numerics.mode_in_force()]
    prov = numerics.provenance()
    machine += (
        f", {prov['cpu']} ({prov['cpu_isa']}), {' and '.join(modes)} numerics "
        f"(docs/numerics.md; portable: the same numbers on any x86-64 CPU with AVX2)"
    )
    lines = [f"# Reproduction report: profile `{profile}`", ""]
    if profile == "ci":
        lines += [SMOKE, ""]
    lines += [
        f"Written {now} by `{command}` on {machine}. Each claim's experiments are ordinary "
        "`fedapt run` seed sweeps (commands below); a claim's verdict is computed from their "
        f"committed records (`{RECORDS_HINT}`) by a rule fixed before any run (its hash is "
        "stored in every record the claim reads; a record of another rule, another code "
        "version, or from a checkout with uncommitted changes is refused). Each check is a "
        "number against a threshold, taken within a seed (paired), from the mean of the "
        "last evaluations of each cell (the claim's window, each of them on the whole test "
        "split; the curves' other evaluations on the experiment's test subset); over the "
        "seeds it gets the "
        "95% Student-t interval of its mean. A claim holds when every interval lies on the "
        "claim's side of its threshold, does not hold when one lies wholly on the other side, "
        "and cannot be said when one straddles its threshold (then the seed policy adds "
        "seeds, up to 8) or a guard (a precondition: the method learned, the driver is "
        "present) is not met. Times are the wall-clock minutes of the runs that finished each "
        "experiment; on a machine shared with other jobs they are pessimistic.",
        "",
        "## Summary",
        "",
        counts(decided),
        "",
        "| # | claim | source | verdict | seeds | rule |",
        "|--:|---|---|---|--:|---|",
    ]
    for i, claim in enumerate(claims, 1):
        v = decided[claim.id]
        lines.append(
            f"| {i} | [{claim.id}](#{i}-{claim.id}) {claim.title} | {claim.source} | "
            f"{label(v, profile)} | {v.seeds or '-'} | `{claim.rule_hash()}` |"
        )
    for i, claim in enumerate(claims, 1):
        v = decided[claim.id]
        runs = [it for it in items if it.experiment.name in claim.needs_all()]
        lines += [
            "",
            f"## {i}. {claim.id}",
            "",
            f"**Claim.** {claim.title}",
            "",
            f"**Paper** ({claim.source}). {claim.paper}",
            "",
        ]
        if note := claim.scaled.get(profile):
            lines += [f"**What ran under `{profile}`, and what was scaled.** {note}", ""]
        for it in runs:
            res = results.get(it.experiment.name)
            took = _minutes(res.seconds if res else None)
            command = " \\\n  ".join(["fedapt run", *(f"--set '{s}'" for s in it.overrides)])
            lines += [
                f"- `{it.params.experiment.name}` ({status(it)}, {took} min{_revalidated(it)}): "
                "<details>"
                f"<summary>the same run alone</summary>\n\n```bash\n{command}\n```\n</details>"
            ]
        for exp_name in claim.needs_all():
            if tuned := tuning_table(items, exp_name):
                lines += ["", tuned]
        lines += ["", f"**fedapt's result.** {v.text}", ""]
        per_cell = [
            cells_table(n, results[n], claim.window) for n in claim.needs_all() if n in results
        ]
        if per_cell:
            lines += [
                "Each cell's test accuracy (the mean of its last evaluations) and traffic, "
                "mean ± sample std (ddof=1) over the seeds:",
                "",
                *(t + "\n" for t in per_cell),
            ]
        if v.table:
            lines += [v.table, ""]
        lines += _dropped(claim)
        lines += [f"**Verdict:** {label(v, profile)} (rule `{claim.rule_hash()}`)."]
        if claim.id in figures:
            lines += ["", f"![{claim.id}]({FIGURES}/{claim.id}.png)"]
    table, total = _experiments_table(items)
    lines += [
        "",
        "## Experiments",
        "",
        table,
        "",
        f"Finished experiments took {total / 60:.1f} minutes in all (sessions that were "
        "interrupted and resumed count only their last session).",
        "",
        "Rerun the same command to finish what is missing: experiments with a record for the "
        "same configuration, code version and numerics are skipped, unfinished ones resume "
        "from their round checkpoints, and this report is rewritten from every record.",
        "",
    ]
    return "\n".join(lines)


def write_report(
    profile: str,
    claims: Sequence[Claim],
    items: Sequence[Planned],
    results: Results,
    root: Path,
    command: str,
) -> Path:
    """figures/*.png, verdicts.json and reproduction.md under ``root``; returns the report."""
    decided = verdicts(claims, items, results, profile)
    figs = write_figures(claims, results, root)
    atomic_write_json(
        root / "verdicts.json",
        {
            c.id: {
                "holds": decided[c.id].holds,
                "seeds": decided[c.id].seeds,
                "rule": c.rule_hash(),
                "text": decided[c.id].text,
            }
            for c in claims
        },
    )
    text = markdown(profile, claims, items, results, decided, figs, command)
    return atomic_write_text(root / REPORT, text)
