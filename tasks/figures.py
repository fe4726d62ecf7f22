"""The figures of a run, drawn with matplotlib from the records fedapt writes (a cell's
``metrics.json`` rounds, the partition's label counts, the grid's records): what MLflow shows
in a run's Artifacts tab and what ``dvc plots show`` renders offline as images.

Each drawing function returns a ``matplotlib.figure.Figure`` (Agg backend, no display
needed); :func:`save_png` renders one with no timestamp or version in the bytes, so the same
records give the same file. The ``write_*`` functions put the PNGs beside the outputs (atomic
writes); no MLflow here (``tasks.artifacts`` logs them).
"""

from __future__ import annotations

import io
import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: servers, CI, Prefect workers

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from tasks.io import atomic_write_bytes  # noqa: E402

MIB = float(2**20)
FIGURES = "figures"  # folder of a cell's figures (and the artifact path in MLflow)
LABEL_HISTOGRAM = "label_histogram.png"
PARETO = "accuracy_vs_mib.png"
PARETO_FRONT = "pareto_front.png"
_SIZE = (6.4, 4.0)


def _figure(size: tuple[float, float] = _SIZE) -> tuple[Figure, Any]:
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _evaluated(rounds: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rounds if r.get("accuracy") is not None]


def accuracy_vs_round(rounds: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Test accuracy after each evaluated round."""
    fig, ax = _figure()
    ev = _evaluated(rounds)
    ax.plot([r["round"] for r in ev], [100 * r["accuracy"] for r in ev], marker="o", ms=3)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    return fig


def accuracy_vs_mib(rounds: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Test accuracy against the cumulative MiB transmitted: upload, download and both."""
    fig, ax = _figure()
    ev = _evaluated(rounds)
    acc = [100 * r["accuracy"] for r in ev]
    up = np.array([r["cum_upload_bytes"] for r in ev], dtype=float) / MIB
    down = np.array([r["cum_download_bytes"] for r in ev], dtype=float) / MIB
    ax.plot(up + down, acc, marker="o", ms=3, label="upload + download")
    # Upload and download are often equal (FedAvg sends the same payload both ways): drawn
    # with their own line style and open markers (^ upload, v download), so that a curve
    # lying on the other still shows, and the legend says when they coincide.
    same = bool(np.array_equal(up, down))
    ax.plot(up, acc, ls="--", marker="^", ms=7, mfc="none", lw=1.6,
            label="upload" + (" (= download)" if same else ""))  # fmt: skip
    ax.plot(down, acc, ls=":", marker="v", ms=7, mfc="none", lw=1.6,
            label="download" + (" (= upload)" if same else ""))  # fmt: skip
    ax.set(xlabel="cumulative MiB transmitted", ylabel="test accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def traffic_by_phase(
    rounds: Sequence[Mapping[str, Any]], title: str, key: str = "freeze_index"
) -> Figure | None:
    """Per-round upload and download MiB, the rounds shaded by phase (FedNILO's freezing
    index); None for a run whose rounds carry no ``key``."""
    if not rounds or any(key not in (r.get("extra") or {}) for r in rounds):
        return None
    fig, ax = _figure()
    x = [r["round"] for r in rounds]
    ax.plot(x, [r["download_bytes"] / MIB for r in rounds], ds="steps-mid", label="download")
    ax.plot(x, [r["upload_bytes"] / MIB for r in rounds], ds="steps-mid", ls="--", lw=1.6,
            label="upload (dashed)")  # fmt: skip
    phase = [r["extra"][key] for r in rounds]
    start = 0
    for i in range(1, len(rounds) + 1):
        if i == len(rounds) or phase[i] != phase[start]:
            if phase[start]:
                ax.axvspan(x[start] - 0.5, x[i - 1] + 0.5, alpha=0.08 + 0.04 * (start % 2))
            ax.annotate(
                f"{key} {int(phase[start])}",
                (x[start], 1.0),
                xycoords=("data", "axes fraction"),
                va="top",
                fontsize=7,
            )
            start = i
    ax.set(xlabel="round", ylabel="MiB per round", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def label_histogram(counts: np.ndarray, title: str) -> Figure:
    """Clients x classes: how many training samples of each class each client holds."""
    counts = np.asarray(counts)
    clients, classes = counts.shape
    fig, ax = _figure((max(4.0, 0.45 * classes + 2.5), max(3.0, 0.28 * clients + 1.5)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set(xlabel="class", ylabel="client", title=title)
    ax.set_xticks(range(classes))
    if clients <= 40:
        ax.set_yticks(range(clients))
    if clients * classes <= 400:
        top = counts.max() if counts.size else 0
        for (i, j), v in np.ndenumerate(counts):
            ax.text(
                j, i, str(int(v)), ha="center", va="center", fontsize=6,
                color="black" if v > 0.6 * top else "white",
            )  # fmt: skip
    fig.colorbar(im, ax=ax, label="samples")
    return fig


def pareto(runs: Mapping[str, Sequence[Mapping[str, Any]]], title: str) -> Figure:
    """Accuracy against cumulative MiB (upload + download) for every cell of the grid: which
    method reaches which accuracy for how many MiB. The last point of each curve is labelled."""
    fig, ax = _figure((8.0, 4.6))
    for name, rounds in runs.items():
        ev = _evaluated(rounds)
        if not ev:
            continue
        mib = [(r["cum_upload_bytes"] + r["cum_download_bytes"]) / MIB for r in ev]
        acc = [100 * r["accuracy"] for r in ev]
        (line,) = ax.plot(mib, acc, marker="o", ms=2, label=name)
        ax.plot(mib[-1:], acc[-1:], marker="o", ms=6, color=line.get_color())  # where it ends
    if any(_evaluated(r) for r in runs.values()):
        ax.set_xscale("log")
        # Beside the axes, never over the curves: constrained layout makes room for it (the
        # names written at each curve's end were clipped at the edge and overlapped).
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="cell (• end)",
                  title_fontsize=7)  # fmt: skip
    ax.set(xlabel="cumulative MiB transmitted (log)", ylabel="test accuracy (%)")
    ax.set_title("\n".join(textwrap.wrap(title, 60)))
    ax.grid(alpha=0.3, which="both")
    return fig


def pareto_points(
    cells: Mapping[str, tuple[str, str, Sequence[Mapping[str, Any]]]], window: int = 1
) -> dict[str, tuple[float, float]]:
    """Per cell (adapter, codec, round records): (total MiB, final ACC in %), ACC the mean
    accuracy of the last ``window`` evaluated rounds. Cells never evaluated are left out."""
    out = {}
    for name, (_, _, rounds) in cells.items():
        ev = _evaluated(rounds)
        if not ev:
            continue
        last = rounds[-1]
        total = (last["cum_upload_bytes"] + last["cum_download_bytes"]) / MIB
        out[name] = (total, 100 * float(np.mean([r["accuracy"] for r in ev[-window:]])))
    return out


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The cells no other cell beats on both: at most as many MiB and at least the accuracy
    (one strictly better), in order of MiB."""
    front = [
        n
        for n, (m, a) in points.items()
        if not any(
            (m2 <= m and a2 >= a) and (m2 < m or a2 > a)
            for n2, (m2, a2) in points.items()
            if n2 != n
        )
    ]
    return sorted(front, key=lambda n: points[n])


_MARKERS = "osD^v<>pP*Xh"


def pareto_front_figure(
    cells: Mapping[str, tuple[str, str, Sequence[Mapping[str, Any]]]], title: str, window: int = 1
) -> Figure:
    """Each cell's final ACC against its total MiB (up + down): colour the adapter, marker
    the codec; the Pareto front (``pareto_front``) joined and its cells named."""
    fig, ax = _figure((8.0, 4.6))
    points = pareto_points(cells, window)
    adapters = sorted({a for a, _, _ in cells.values()})
    codecs = list(dict.fromkeys(c for _, c, _ in cells.values()))
    colours = {a: f"C{i % 10}" for i, a in enumerate(adapters)}
    for name, (mib, acc) in points.items():
        adapter, codec, _ = cells[name]
        ax.plot([mib], [acc], linestyle="none", color=colours[adapter],
                marker=_MARKERS[codecs.index(codec) % len(_MARKERS)], ms=7)  # fmt: skip
    front = pareto_front(points)
    if front:
        xs, ys = zip(*(points[n] for n in front), strict=True)
        ax.plot(xs, ys, color="black", lw=1, ls="--", zorder=0, label="Pareto front")
        for n in front:
            ax.annotate(n, points[n], fontsize=6, xytext=(4, 4), textcoords="offset points")
        ax.set_xscale("log")
    handles = [Line2D([], [], color=colours[a], marker="o", ls="none", label=a) for a in adapters]
    handles += [
        Line2D([], [], color="grey", ls="none", marker=_MARKERS[i % len(_MARKERS)], label=c)
        for i, c in enumerate(codecs)
    ]
    if front:
        handles.append(Line2D([], [], color="black", ls="--", label="Pareto front"))
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="adapter (colour), codec (marker)", title_fontsize=7)  # fmt: skip
    acc_label = (
        f"final ACC (%, mean of the last {window} evaluations)"
        if window > 1
        else ("final test accuracy (%)")
    )
    ax.set(xlabel="total MiB transmitted, up + down (log)", ylabel=acc_label)
    ax.set_title("\n".join(textwrap.wrap(title, 60)))
    ax.grid(alpha=0.3, which="both")
    return fig


def save_png(fig: Figure) -> bytes:
    """The PNG bytes of ``fig``: no software version or date in them (reproducible)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def cell_figures(rounds: Sequence[Mapping[str, Any]], cell: str) -> dict[str, Figure]:
    """The figures of one grid cell, by file name."""
    figs = {
        "accuracy_vs_round.png": accuracy_vs_round(rounds, f"{cell}: accuracy per round"),
        "accuracy_vs_mib.png": accuracy_vs_mib(rounds, f"{cell}: accuracy vs MiB"),
    }
    phases = traffic_by_phase(rounds, f"{cell}: traffic per round by phase")
    if phases is not None:
        figs["traffic_by_phase.png"] = phases
    return figs


def write_cell_figures(cell_dir: str | Path, rounds: Sequence[Mapping[str, Any]]) -> list[Path]:
    """``<cell_dir>/figures/*.png`` from the cell's round records (same records, same bytes)."""
    out = Path(cell_dir) / FIGURES
    cell = Path(cell_dir).name
    return [
        atomic_write_bytes(out / name, save_png(fig))
        for name, fig in cell_figures(rounds, cell).items()
    ]


def client_sizes(sizes: Sequence[int], num_labels: Sequence[int], title: str) -> Figure:
    """Samples and distinct labels per client: the partition at a glance when the classes are
    too many for a clients x classes table (next-token labels: a vocabulary)."""
    fig, ax = _figure()
    x = np.arange(len(sizes))
    ax.bar(x, sizes, label="samples")
    ax.bar(x, num_labels, width=0.5, label="distinct labels")
    ax.set(xlabel="client", ylabel="count", title=title)
    ax.legend()
    return fig


def write_label_histogram(partition_dir: str | Path) -> Path:
    """``<partition_dir>/label_histogram.png`` from its ``stats.json`` (clients x classes; or,
    for stats without per-class counts, samples and distinct labels per client)."""
    d = Path(partition_dir)
    stats = json.loads((d / "stats.json").read_text())
    clients = stats["clients"]
    if clients and "label_counts" not in clients[0]:  # many classes (fedcore.manifest)
        title = f"{stats['scheme']} over {stats['num_clients']} clients ({stats['num_classes']} classes)"
        fig = client_sizes([c["size"] for c in clients], [c["num_labels"] for c in clients], title)
        return atomic_write_bytes(d / LABEL_HISTOGRAM, save_png(fig))
    counts = np.array([c["label_counts"] for c in clients], dtype=np.int64)
    title = f"{stats['scheme']} over {stats['num_clients']} clients: samples per class"
    return atomic_write_bytes(d / LABEL_HISTOGRAM, save_png(label_histogram(counts, title)))


def write_pareto_front(
    cells: Mapping[str, tuple[str, str, Sequence[Mapping[str, Any]]]],
    out_dir: str | Path,
    experiment: str,
    window: int = 1,
) -> Path:
    """pareto_front.png: the grid's cells as accuracy against bytes, adapters x codecs."""
    fig = pareto_front_figure(cells, f"{experiment}: accuracy vs MiB, Pareto front", window)
    return atomic_write_bytes(Path(out_dir) / PARETO_FRONT, save_png(fig))


def write_grid_figure(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | Path, experiment: str
) -> Path:
    """The grid's accuracy-vs-MiB figure: which cell reaches which accuracy for how many MiB."""
    fig = pareto(runs, f"{experiment}: accuracy vs MiB transmitted")
    return atomic_write_bytes(Path(out_dir) / PARETO, save_png(fig))
