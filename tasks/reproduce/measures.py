"""Pure measures the verdicts share, over a cell's records (no files, no torch)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.reproduce.spec import Cell, ExperimentResult

MIB = float(2**20)


def evaluated(cell: Cell) -> list[float]:
    """Test accuracy of every evaluated round, in round order (fractions)."""
    return [float(r["accuracy"]) for r in cell.rounds if r.get("accuracy") is not None]


def final_accuracy(cell: Cell) -> float | None:
    acc = cell.record.get("final_accuracy")
    if acc is None:
        accs = evaluated(cell)
        return accs[-1] if accs else None
    return float(acc)


def end_level(cell: Cell, window: int) -> float | None:
    """A verdict metric: the mean test accuracy (fraction) of the cell's last ``window``
    evaluations (``Claim.window``), never one final evaluation alone (on 1,000 test images
    one evaluation has a standard error of about 1.3 points)."""
    return last_mean(cell, window)


def start_level(result: ExperimentResult) -> float | None:
    """What a cell's training starts from (fraction): the pretrained base's test accuracy when
    the experiment has one pretrained on its own task (:func:`base_in_domain`), else the class
    prior (the accuracy of a model that learned nothing but the most frequent class; a random
    initialisation, or a base of other classes or another dataset under the federation's fresh
    classifier, is about there). None when unknown."""
    if result.base_accuracy is not None and base_in_domain(result.params):
        return result.base_accuracy
    return result.majority


def base_in_domain(params: Mapping[str, Any]) -> bool:
    """Whether a pretrained base's test accuracy (its card) was measured on the federation's
    task: a base of ``pretrain.classes`` or of another ``pretrain.dataset`` was tested on its
    own source classes (``tasks/data/pretrain.py``), and the federated model copies everything but
    its classifier (``tasks.data.backbone.load_base``), so on the federation's task it starts about
    at the class prior."""
    source = params.get("pretrain.dataset")
    same = source is None or source == params.get("data.dataset")
    return same and params.get("pretrain.classes") is None


def learned_points(cell: Cell, result: ExperimentResult, window: int) -> float | None:
    """How far (points) the cell's end level (:func:`end_level`) lies above what its training
    started from (:func:`start_level`): the value of a "the method learned" guard."""
    end, start = end_level(cell, window), start_level(result)
    return None if end is None or start is None else 100 * (end - start)


def step_variance(cell: Cell, tail: float = 0.5) -> float | None:
    """Variance of the round-to-round change of test accuracy (in points squared) over the
    last ``tail`` of the evaluated rounds, at least the last 3: how much the model jumps
    between rounds (seed 002 Figs. 8-9: "more stable convergence especially in the last
    rounds"). None with fewer than 3 evaluated rounds."""
    accs = [100 * a for a in evaluated(cell)]
    accs = accs[-max(3, round(len(accs) * tail)) :]
    steps = [b - a for a, b in zip(accs, accs[1:], strict=False)]
    if len(steps) < 2:
        return None
    return statistics.pvariance(steps)


def trend_rise(cell: Cell, share: float = 0.5, least: int = 5) -> float | None:
    """How far (points) a curve still climbs at its end: the rise, from its first to its last
    round, of the least-squares line through the last ``share`` of its evaluated rounds (at
    least ``least``): a plateau guard's value. A line through many rounds rather than the
    difference of two short means: on a curve that jumps 2-3 points between rounds, the
    latter's noise is as large as the rises it is meant to find. None with fewer than
    ``least`` evaluated rounds."""
    ev = [
        (float(r["round"]), 100 * float(r["accuracy"]))
        for r in cell.rounds
        if r.get("accuracy") is not None
    ]
    if len(ev) < max(2, least):
        return None
    ev = ev[-max(least, math.ceil(len(ev) * share)) :]
    xs, ys = [x for x, _ in ev], [y for _, y in ev]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in ev) / sxx
    return slope * (xs[-1] - xs[0])


def upto(cell: Cell, rounds: int) -> Cell:
    """The cell's curve up to round ``rounds`` (its summary record unchanged): curves that ran
    for different numbers of rounds read over the rounds all of them ran."""
    return Cell(cell.record, [r for r in cell.rounds if int(r["round"]) <= rounds])


def last_mean(cell: Cell, last: int = 5) -> float | None:
    """Mean test accuracy (fraction) of the last ``last`` evaluated rounds: a curve's end
    level, read as one reads a noisy curve's end off a figure; None without evaluations."""
    accs = evaluated(cell)[-last:]
    return statistics.fmean(accs) if accs else None


def trailing(cell: Cell, window: int = 3) -> list[tuple[int, float]]:
    """(round, mean accuracy of the ``window`` evaluated rounds ending there), from the
    ``window``-th evaluated round on: the curve with its round-to-round jumps smoothed."""
    ev = [
        (int(r["round"]), float(r["accuracy"]))
        for r in cell.rounds
        if r.get("accuracy") is not None
    ]
    return [
        (ev[i][0], statistics.fmean(a for _, a in ev[i + 1 - window : i + 1]))
        for i in range(window - 1, len(ev))
    ]


def rounds_to(cell: Cell, level: float, window: int = 3) -> int | None:
    """The first round at which the curve's ``window``-round trailing mean reaches ``level``
    (a fraction); None if it never does."""
    hit = [r for r, a in trailing(cell, window) if a >= level]
    return hit[0] if hit else None


def convergence_round(
    cell: Cell, share: float = 0.95, last: int = 5, window: int = 3
) -> int | None:
    """Seed 002's "convergence time" (§4.1, Figs. 2-5), read off a curve: the first round at
    which its ``window``-round trailing mean reaches ``share`` of its own end level
    (:func:`last_mean` over ``last`` rounds), i.e. when the curve has flattened near where it
    ends. None without evaluated rounds."""
    end = last_mean(cell, last)
    return None if end is None else rounds_to(cell, share * end, window)


def mib_per_round(cell: Cell) -> float:
    """Upload + download MiB of the cell's last round (the payload, all clients, each way)."""
    r = cell.record
    return (int(r["upload_bytes_per_round"]) + int(r["download_bytes_per_round"])) / MIB


def pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}"


def num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; the first column left-aligned, the others right-aligned."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *["--:"] * (len(header) - 1)]) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def param(params: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A flat param of the experiment (summary.json ``params``)."""
    return params.get(key, default)
