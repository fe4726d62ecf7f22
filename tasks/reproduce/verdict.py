"""A claim's verdict over seeds (pure): each seed's reading (``Claim.measure``) gives checks
that hold or not on that seed; the claim holds when every check holds on every seed, does not
hold when some check fails on every seed, and "cannot say" otherwise: the seeds straddle a
threshold, a guard (a precondition of the comparison) fails on some seed, or something could
not be measured. The table gives each check's mean ± sample std (ddof=1) and per-seed values,
so a reader sees how far each seed is from the threshold."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from tasks.reproduce.measures import table
from tasks.reproduce.spec import Check, Claim, Reading, Results, Verdict, common_seeds, one_seed


def mean_std(values: Sequence[float | None], fmt: str = ".2f") -> str:
    """``mean ± std`` of the measured values (ddof=1; the mean alone with one), ``-`` if none."""
    ok = [v for v in values if v is not None]
    if not ok:
        return "-"
    text = format(statistics.fmean(ok), fmt)
    return text if len(ok) < 2 else f"{text} ± {format(statistics.stdev(ok), fmt)}"


def _side(oks: Sequence[bool | None]) -> bool | None:
    """True: every seed on the holding side; False: every seed on the other; None: mixed or
    not measurable."""
    if all(o is True for o in oks):
        return True
    if all(o is False for o in oks):
        return False
    return None


def decide(claim: Claim, results: Results, needs: Sequence[str], min_seeds: int) -> Verdict:
    """The verdict of ``claim`` from the finished ``results`` of the experiments it ``needs``
    (those of the profile that ran), over the seeds all of them finished; fewer than
    ``min_seeds`` seeds give "cannot say yet"."""
    if not needs:
        return Verdict(None, "not run under this profile (what ran, above, says why)")
    absent = [n for n in needs if n not in results]
    if absent:
        return Verdict(
            None, f"not run yet: {', '.join(absent)} (rerun `fedapt reproduce` to finish)"
        )
    mine = {n: results[n] for n in needs}
    seeds = common_seeds(mine)
    if not seeds:
        return Verdict(None, "no seed has finished every experiment of this claim")
    readings = [(s, claim.measure(one_seed(mine, s))) for s in seeds]
    return combine(claim, readings, min_seeds)


def combine(claim: Claim, readings: Sequence[tuple[int, Reading]], min_seeds: int = 3) -> Verdict:
    """Decide from each seed's reading (see the module's docstring)."""
    seeds = [s for s, _ in readings]
    names: list[str] = []
    by_name: dict[str, dict[int, Check]] = {}
    for s, r in readings:
        for c in r.checks:
            if c.name not in by_name:
                names.append(c.name)
                by_name[c.name] = {}
            by_name[c.name][s] = c
    rows, failed, straddled, guarded = [], [], [], []
    for name in names:
        per = [by_name[name].get(s) for s in seeds]
        oks = [c.ok if c is not None else None for c in per]
        values = [c.value if c is not None else None for c in per]
        first = next(c for c in per if c is not None)
        side = _side(oks)
        if first.guard:
            if side is not True:
                guarded.append(name)
        elif side is False:
            failed.append(name)
        elif side is None:
            straddled.append(name)
        rows.append(
            [
                name + (" (guard)" if first.guard else ""),
                first.rule,
                mean_std(values),
                ", ".join("-" if v is None else f"{v:.2f}" for v in values),
                f"{sum(o is True for o in oks)} of {len(seeds)}",
            ]
        )
    n = len(seeds)
    head = f"Over {n} seed{'s' if n != 1 else ''} ({', '.join(map(str, seeds))}). {claim.rule}"
    notes = _notes(readings)
    if n < min_seeds:
        head += f" Only {n} of the {min_seeds} seeds a verdict needs have finished."
    tab = ""
    if rows:
        tab = table(["check", "holds if", "mean ± std", "per seed", "seeds that hold"], rows)
    details = "\n\n".join(
        f"<details><summary>seed {s}</summary>\n\n{r.table}\n</details>"
        for s, r in readings
        if r.table
    )
    tab = "\n\n".join(t for t in (tab, details) if t)
    if not rows:
        return Verdict(None, " ".join([head, "Nothing could be measured.", *notes]), tab)
    if guarded:
        word, holds = f"Cannot say: the precondition {_names(guarded)} fails on some seed.", None
    elif failed:
        word, holds = f"Does not hold: {_names(failed)} fails on every seed.", False
    elif straddled:
        word = f"Cannot say: the seeds straddle the threshold of {_names(straddled)}."
        holds = None
    else:
        word, holds = "Holds on every seed.", True
    if n < min_seeds:
        holds = None
        word = f"Cannot say yet ({n} of {min_seeds} seeds). " + word
    return Verdict(holds, " ".join([head, word, *notes, claim.tolerance]), tab)


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def _notes(readings: Sequence[tuple[int, Reading]]) -> list[str]:
    """Each distinct note once, with the seeds it came from when not all."""
    seen: dict[str, list[int]] = {}
    for s, r in readings:
        if r.note:
            seen.setdefault(r.note, []).append(s)
    n = len(readings)
    return [
        note if len(ss) == n else f"(seed {', '.join(map(str, ss))}) {note}"
        for note, ss in seen.items()
    ]
