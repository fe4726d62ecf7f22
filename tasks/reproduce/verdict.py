"""A claim's verdict over seeds (pure), by intervals fixed before anything runs.

Each seed's reading (``Claim.measure``) gives checks: a number against a threshold, where a
difference between two methods is taken within the seed (paired: the same partition, base,
initialisation and client draws). Over the seeds, each check's values give a mean and its
two-sided 95% Student-t interval (``mean ± t(0.975, n-1) · sd / sqrt(n)``, sd with ddof=1):

* a check **holds** when its whole interval lies on the claim's side of the threshold,
  **fails** when its whole interval lies on the other side, and **straddles** otherwise;
* the claim **holds** when every check holds and every guard holds; it **does not hold** when
  some check fails (its guards holding); it **cannot say** when a guard's interval is not on
  its side (a precondition of the comparison, e.g. the method learned anything), when a check
  straddles, when something could not be measured, or before ``Claim.seeds.start`` seeds
  finished. While a check's (or a guard's) interval straddles and fewer than
  ``Claim.seeds.most`` seeds ran, the verdict asks for one seed more (``Verdict.more_seeds``).

One seed alone (the unit tests' hand-made readings) has an interval of zero width: its value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.reproduce.measures import table
from tasks.reproduce.spec import (
    Check,
    Claim,
    Reading,
    Results,
    Verdict,
    common_seeds,
    on_side,
    one_seed,
)


def mean_std(values: Sequence[float | None], fmt: str = ".2f") -> str:
    """``mean ± std`` of the measured values (ddof=1; the mean alone with one), ``-`` if none."""
    ok = [v for v in values if v is not None]
    if not ok:
        return "-"
    text = format(statistics.fmean(ok), fmt)
    return text if len(ok) < 2 else f"{text} ± {format(statistics.stdev(ok), fmt)}"


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student-t quantile ``t((1 + confidence) / 2, df)`` (scipy)."""
    from scipy.stats import t

    return float(t.ppf((1.0 + confidence) / 2.0, df))


@dataclass(frozen=True)
class Interval:
    """A check's values over the seeds: their mean and confidence interval."""

    n: int
    mean: float
    low: float
    high: float

    def text(self) -> str:
        return f"[{self.low:.2f}, {self.high:.2f}]"


def interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``values`` and its two-sided Student-t interval (one value: zero width)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(n, mean, mean, mean)
    half = t_quantile(confidence, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)


def side_of(check: Check, iv: Interval) -> str:
    """``holds`` (the whole interval on the check's side), ``fails`` (wholly on the other) or
    ``straddles``."""
    low_ok = on_side(iv.low, check.side, check.threshold)
    high_ok = on_side(iv.high, check.side, check.threshold)
    if low_ok and high_ok:
        return "holds"
    if not low_ok and not high_ok:
        return "fails"
    return "straddles"


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
    wrong = [n for n, r in mine.items() if r.rules.get(claim.id) != claim.rule_hash()]
    if wrong:  # the report refuses these before it decides; a verdict never reads them
        return Verdict(
            None,
            f"refused: {', '.join(wrong)} ran under another rule than this claim's "
            f"{claim.rule_hash()} (rerun it)",
        )
    seeds = common_seeds(mine)
    if not seeds:
        return Verdict(None, "no seed has finished every experiment of this claim")
    readings = [(s, claim.measure(one_seed(mine, s))) for s in seeds]
    return combine(claim, readings, min_seeds)


def combine(claim: Claim, readings: Sequence[tuple[int, Reading]], min_seeds: int = 3) -> Verdict:
    """Decide from each seed's reading (see the module's docstring)."""
    seeds = [s for s, _ in readings]
    conf = claim.seeds.confidence
    names: list[str] = []
    by_name: dict[str, dict[int, Check]] = {}
    for s, r in readings:
        for c in r.checks:
            if c.name not in by_name:
                names.append(c.name)
                by_name[c.name] = {}
            by_name[c.name][s] = c
    rows, failed, straddled, guarded, unmeasured = [], [], [], [], []
    guard_straddled: list[str] = []
    for name in names:
        per = [by_name[name].get(s) for s in seeds]
        values = [c.value if c is not None else None for c in per]
        first = next(c for c in per if c is not None)
        got = [v for v in values if v is not None]
        if len(got) < len(seeds):
            where, iv = "not measured on every seed", None
            unmeasured.append(name)
        else:
            iv = interval(got, conf)
            where = side_of(first, iv)
        if first.guard:
            if where != "holds" and name not in unmeasured:
                guarded.append(name)
                if where == "straddles":
                    guard_straddled.append(name)
        elif where == "fails":
            failed.append(name)
        elif where == "straddles":
            straddled.append(name)
        rows.append(
            [
                name + (" (guard)" if first.guard else ""),
                first.rule,
                mean_std(values),
                "-" if iv is None else iv.text(),
                ", ".join("-" if v is None else f"{v:.2f}" for v in values),
                where,
            ]
        )
    n = len(seeds)
    head = f"Over {n} seed{'s' if n != 1 else ''} ({', '.join(map(str, seeds))}). {claim.rule}"
    notes = _notes(readings)
    if n < min_seeds:
        head += f" Only {n} of the {min_seeds} seeds a verdict needs have finished."
    tab = ""
    if rows:
        tab = table(
            [
                "check",
                "holds if",
                "mean ± std",
                f"{100 * conf:g}% interval of the mean",
                "per seed",
                "interval",
            ],
            rows,
        )
    details = "\n\n".join(
        f"<details><summary>seed {s}</summary>\n\n{r.table}\n</details>"
        for s, r in readings
        if r.table
    )
    tab = "\n\n".join(t for t in (tab, details) if t)
    if not rows:
        return Verdict(None, " ".join([head, "Nothing could be measured.", *notes]), tab)
    more = False
    guard_unmeasured = [x for x in unmeasured if by_name[x][_first_seed(by_name[x])].guard]
    if guarded or guard_unmeasured:
        word, holds = (
            f"Cannot say: the precondition {_names(guarded + guard_unmeasured)} is not met "
            "(its interval is not on its side, or it was not measured on every seed).",
            None,
        )
        # a guard whose interval straddles may be met with more seeds; one wholly on the
        # other side, or not measured, will not
        more = guard_straddled == guarded and not guard_unmeasured and n < claim.seeds.most
    elif failed:
        word, holds = f"Does not hold: {_names(failed)} lies on the other side.", False
    elif unmeasured:
        word, holds = f"Cannot say: {_names(unmeasured)} was not measured on every seed.", None
    elif straddled:
        word = f"Cannot say: the interval of {_names(straddled)} straddles its threshold."
        holds, more = None, n < claim.seeds.most
        if not more:
            word += f" ({n} seeds, the most the seed policy allows.)"
    else:
        word, holds = "Holds: every interval lies on the claim's side.", True
    if n < min_seeds:
        holds, more = None, False
        word = f"Cannot say yet ({n} of {min_seeds} seeds). " + word
    text = " ".join([head, word, *notes, claim.tolerance])
    return Verdict(holds, text, tab, more_seeds=more, seeds=n)


def _first_seed(per: dict[int, Check]) -> int:
    return next(iter(per))


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
