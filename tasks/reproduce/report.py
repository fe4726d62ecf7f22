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
from tasks.figures import save_png
from tasks.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tasks.reproduce import records
from tasks.reproduce.registry import unmet
from tasks.reproduce.runs import FIGURES, REPORT, Planned, status
from tasks.reproduce.spec import Claim, ExperimentResult, Results, Verdict
from tasks.reproduce.verdict import decide

RECORDS_HINT = "records/<experiment>.json"
SMOKE = (
    "> **Smoke test, not a reproduction.** The `ci` profile runs every claim's pipeline end "
    "to end on tiny subsets for one to three rounds so that it cannot rot. Its numbers and "
    'its "holds" column say nothing about the papers; run `--profile cpu` (about two '
    "hours on 2 cores) or `--profile gpu` (the seeds' protocols) for that."
)


def label(v: Verdict, profile: str) -> str:
    word = {True: "holds", False: "does not hold", None: "cannot say"}[v.holds]
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


def cells_table(name: str, result: ExperimentResult) -> str:
    """One experiment's cells: final accuracy (%) and MiB per round, mean ± std over seeds."""
    from tasks.reproduce.measures import final_accuracy, mib_per_round
    from tasks.reproduce.verdict import mean_std

    rows = [
        f"| `{name}` cell | final acc % | MiB/round | seeds |",
        "|---|--:|--:|--:|",
    ]
    cells = sorted({c for per in result.runs.values() for c in per})
    for c in cells:
        got = [result.runs[s][c] for s in result.seeds if c in result.runs[s]]
        accs = [final_accuracy(x) for x in got]
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
        "| experiment | claim | cells | seeds | status | minutes | resumed |",
        "|---|---|---|---|---|--:|---|",
    ]
    total = 0.0
    for item in items:
        stamp = records.read_record(item.record) or {}
        seconds = stamp.get("seconds") if (st := status(item)) == "done" else None
        total += float(seconds or 0)
        g = item.params.grid
        cells = ", ".join(f"{a}-{d}" for a in g.algorithms for d in g.adapters)
        seeds = ", ".join(map(str, item.params.experiment.seeds or [item.params.experiment.seed]))
        rows.append(
            f"| `{item.params.experiment.name}` | {item.claim.id} | {cells} | {seeds} | {st} | "
            f"{_minutes(seconds)} | {'yes' if stamp.get('resumed') else ''} |"
        )
    return "\n".join(rows), total


def _revalidated(item: Planned) -> str:
    """Where an experiment's numbers come from an older code version whose first rounds this
    one reproduced (``--revalidate``): the codes and what was checked."""
    rec = records.read_record(item.record) or {}
    checks = rec.get("revalidated") or []
    if not checks:
        return ""
    first, last = checks[0], checks[-1]
    return (
        f"; computed by code {first['from']}, revalidated at {last['to']}: seed 0's first "
        f"{last['rounds']} rounds identical"
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
        f"Written {now} by `{command}` on {machine}, code version "
        f"{records.loaded_code_version()}. Each claim's experiments are ordinary `fedapt run` seed "
        "sweeps (commands below); a claim's verdict is computed from their committed records "
        f"(`{RECORDS_HINT}`) by a fixed rule stated with it, decided before any run, on every "
        "seed: it holds when every check holds on every seed, does not hold when a check "
        "fails on every seed, and cannot be said when the seeds straddle a threshold. Times "
        "are the "
        "wall-clock minutes of the run that finished each experiment; on a machine shared "
        "with other jobs they are pessimistic.",
        "",
        "## Summary",
        "",
        "| # | claim | source | direction |",
        "|--:|---|---|---|",
    ]
    for i, claim in enumerate(claims, 1):
        lines.append(
            f"| {i} | [{claim.id}](#{i}-{claim.id}) {claim.title} | {claim.source} | "
            f"{label(decided[claim.id], profile)} |"
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
        per_cell = [cells_table(n, results[n]) for n in claim.needs_all() if n in results]
        if per_cell:
            lines += [
                "Each cell's final test accuracy and traffic, mean ± sample std (ddof=1) over "
                "the seeds:",
                "",
                *(t + "\n" for t in per_cell),
            ]
        if v.table:
            lines += [v.table, ""]
        lines += [f"**Direction:** {label(v, profile)}."]
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
        {c.id: {"holds": decided[c.id].holds, "text": decided[c.id].text} for c in claims},
    )
    text = markdown(profile, claims, items, results, decided, figs, command)
    return atomic_write_text(root / REPORT, text)
