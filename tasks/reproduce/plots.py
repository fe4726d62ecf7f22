"""The figures of the reproduction report, in tasks/results/figures.py's style: matplotlib (Agg),
one ``Figure`` per claim drawn from the finished records, saved by ``figures.save_png`` (same
records, same bytes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from tasks.reproduce.measures import MIB
from tasks.reproduce.spec import Results
from tasks.results import figures  # noqa: F401  (selects the Agg backend before any drawing)

Line = tuple[str, str, str]  # (experiment, cell, label)


def _figure(cols: int = 1, size: tuple[float, float] = (6.4, 4.0)) -> tuple[Figure, Any]:
    fig = Figure(figsize=(size[0] * cols, size[1]), dpi=100, layout="constrained")
    axes = fig.subplots(1, cols, squeeze=False)[0]
    return fig, axes


def accuracy_curves(results: Results, lines: Sequence[Line], title: str, ax: Any = None) -> Any:
    """Test accuracy per evaluated round of each (experiment, cell); absent ones are skipped.
    Returns the new figure, or None when drawn into the given ``ax``."""
    fig = None
    if ax is None:
        fig, (ax,) = _figure()
    drawn = 0
    for exp, cell, label in lines:
        c = results.get(exp) and results[exp].cells.get(cell)
        if not c:
            continue
        ev = [r for r in c.rounds if r.get("accuracy") is not None]
        ax.plot(
            [r["round"] for r in ev],
            [100 * r["accuracy"] for r in ev],
            marker="o",
            ms=2,
            label=label,
        )
        drawn += 1
    ax.set(xlabel="round", ylabel="test accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    return fig


def accuracy_vs_mib(results: Results, lines: Sequence[Line], title: str, ax: Any = None) -> Any:
    """Test accuracy against cumulative MiB (upload + download), log x."""
    fig = None
    if ax is None:
        fig, (ax,) = _figure()
    drawn = 0
    for exp, cell, label in lines:
        c = results.get(exp) and results[exp].cells.get(cell)
        if not c:
            continue
        ev = [r for r in c.rounds if r.get("accuracy") is not None]
        x = [(r["cum_upload_bytes"] + r["cum_download_bytes"]) / MIB for r in ev]
        ax.plot(x, [100 * r["accuracy"] for r in ev], marker="o", ms=2, label=label)
        drawn += 1
    if drawn:
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    ax.set(xlabel="cumulative MiB transmitted (log)", ylabel="test accuracy (%)", title=title)
    ax.grid(alpha=0.3, which="both")
    return fig


def bars(
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    title: str,
    ylabel: str,
    ax: Any = None,
) -> Any:
    """Grouped bars: one group per entry of ``groups``, one bar per series (None: no bar)."""
    fig = None
    if ax is None:
        fig, (ax,) = _figure()
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [0.0 if v is None else v for v in values]
        ax.bar(xs, ys, width=width, label=label)
    ax.set_xticks(range(len(groups)), list(groups), fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")
    if series:
        ax.legend(fontsize=7)
    return fig


def panels(cols: int) -> tuple[Figure, Any]:
    """A figure of ``cols`` side-by-side axes for a claim with several views."""
    return _figure(cols)
