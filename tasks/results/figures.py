"""The figures of a run, drawn with matplotlib from the records fedapt writes (a cell's
``metrics.json`` rounds, the partition's label counts, the grid's records): what MLflow shows
in a run's Artifacts tab and what ``dvc plots show`` renders offline as images.

Each drawing function returns a ``matplotlib.figure.Figure`` (Agg backend, no display
needed); :func:`save_png` renders one with no timestamp or version in the bytes, so the same
records give the same file. The ``write_*`` functions put the PNGs beside the outputs (atomic
writes); no MLflow here (``tasks.results.artifacts`` logs them).
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

from tasks.io import atomic_write_bytes, atomic_write_json  # noqa: E402

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


def last_l(record: Mapping[str, Any]) -> int:
    """The L that ``mean_accuracy_last_L`` averages over: the record's ``last_rounds_L``
    (federation.last_rounds) capped by the rounds it evaluated (fedcore.events.History takes
    the last L evaluated rounds, all of them when fewer). ``record``: a cell's metrics.json,
    whose ``rounds`` is the per-round list (a run's in-memory record counts them only)."""
    rounds = record["rounds"]
    if isinstance(rounds, int):
        raise TypeError("last_l needs the per-round list of the cell's metrics.json")
    return min(int(record["last_rounds_L"]), len(_evaluated(rounds)))


FINAL = "final_accuracy"
MEAN_LAST = "mean_accuracy_last_L"
# The two accuracies every figure and table shows (fedcore.events.History; metrics.json,
# scores.json, summary.json and MLflow hold them under these names), and their labels.
METRICS = (FINAL, MEAN_LAST)


def metric_label(metric: str, ls: Sequence[int] = ()) -> str:
    """What ``metric`` is, its L named: "mean accuracy of the last 5 evaluated rounds"; with
    cells of different L (a run stopped early), every L ("the last L = 3, 5 ...")."""
    if metric == FINAL:
        return "final accuracy (the last evaluated round)"
    if metric != MEAN_LAST:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    distinct = sorted(set(ls))
    if len(distinct) == 1:
        return f"mean accuracy of the last {distinct[0]} evaluated rounds"
    return f"mean accuracy of the last L evaluated rounds (L = {', '.join(map(str, distinct))})"


def cell_points(records: Mapping[str, Mapping[str, Any]], metric: str) -> dict[str, dict[str, Any]]:
    """Per cell (name -> its metrics.json record): its total MiB (upload + download, as
    scores.json's total_mib), the record's ``metric`` and its L (:func:`last_l`). Cells never
    evaluated are left out. What pareto_front.png draws and pareto_front.json holds."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    out = {}
    for name, r in records.items():
        if r.get(metric) is None:
            continue
        out[name] = {
            "total_mib": (r["upload_bytes"] + r["download_bytes"]) / MIB,
            metric: float(r[metric]),
            "L": last_l(r),
        }
    return out


def curves(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """Per cell, its evaluated rounds as cumulative MiB (upload + download) and test accuracy
    in %: what accuracy_vs_mib.png draws and accuracy_vs_mib.json holds (each curve ends at the
    cell's final accuracy). Cells never evaluated are left out."""
    out = {}
    for name, rounds in runs.items():
        ev = _evaluated(rounds)
        if ev:
            out[name] = {
                "round": [int(r["round"]) for r in ev],
                "mib": [(r["cum_upload_bytes"] + r["cum_download_bytes"]) / MIB for r in ev],
                "accuracy_pct": [100 * r["accuracy"] for r in ev],
            }
    return out


def pareto(runs: Mapping[str, Sequence[Mapping[str, Any]]], title: str) -> Figure:
    """Accuracy against cumulative MiB (upload + download) for every cell of the grid: which
    method reaches which accuracy for how many MiB. The last point of each curve, its final
    accuracy, is marked."""
    fig, ax = _figure((8.0, 4.6))
    drawn = curves(runs)
    for name, c in drawn.items():
        (line,) = ax.plot(c["mib"], c["accuracy_pct"], marker="o", ms=2, label=name)
        ax.plot(c["mib"][-1:], c["accuracy_pct"][-1:], marker="o", ms=6, color=line.get_color())
    if drawn:
        ax.set_xscale("log")
        # Beside the axes, never over the curves: constrained layout makes room for it (the
        # names written at each curve's end were clipped at the edge and overlapped).
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="cell (• final accuracy)", title_fontsize=7)  # fmt: skip
    ax.set(xlabel="cumulative MiB transmitted (log)", ylabel="test accuracy (%)")
    ax.set_title("\n".join(textwrap.wrap(title, 60)))
    ax.grid(alpha=0.3, which="both")
    return fig


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


def pareto_data(
    cells: Mapping[str, tuple[str, str, Mapping[str, Any]]], metric: str
) -> dict[str, Any]:
    """pareto_front.png's source data (pareto_front.json): per cell (adapter, codec, its
    metrics.json record), its point (:func:`cell_points`), the ``metric`` and its label, and
    the Pareto front, drawn as a line only when it joins two cells or more."""
    points = cell_points({n: r for n, (_, _, r) in cells.items()}, metric)
    front = pareto_front({n: (p["total_mib"], p[metric]) for n, p in points.items()})
    ls = [p["L"] for p in points.values()]
    return {
        "metric": metric,
        "label": metric_label(metric, ls),
        "points": {
            n: {"adapter": cells[n][0], "codec": cells[n][1], **p} for n, p in points.items()
        },
        "front": front if len(front) >= 2 else [],
    }


def pareto_front_figure(data: Mapping[str, Any], title: str) -> Figure:
    """Each cell's accuracy (``data``: :func:`pareto_data`) against its total MiB (up + down):
    colour the adapter, marker the codec, one legend entry per cell as drawn; the Pareto
    front joined and its cells named when it has two cells or more."""
    fig, ax = _figure((8.0, 4.6))
    metric, points = data["metric"], data["points"]
    adapters = sorted({p["adapter"] for p in points.values()})
    codecs = list(dict.fromkeys(p["codec"] for p in points.values()))
    colours = {a: f"C{i % 10}" for i, a in enumerate(adapters)}
    for name, p in points.items():
        ax.plot([p["total_mib"]], [100 * p[metric]], linestyle="none", label=name,
                color=colours[p["adapter"]],
                marker=_MARKERS[codecs.index(p["codec"]) % len(_MARKERS)], ms=7)  # fmt: skip
    front = data["front"]
    if front:
        xs = [points[n]["total_mib"] for n in front]
        ys = [100 * points[n][metric] for n in front]
        ax.plot(xs, ys, color="black", lw=1, ls="--", zorder=0, label="Pareto front")
        for n, x, y in zip(front, xs, ys, strict=True):
            ax.annotate(n, (x, y), fontsize=6, xytext=(4, 4), textcoords="offset points")
    if points:
        ax.set_xscale("log")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="cell (colour: adapter,\nmarker: codec)", title_fontsize=7)  # fmt: skip
    ax.set(xlabel="total MiB transmitted, up + down (log)", ylabel=f"{data['label']} (%)")
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
    cells: Mapping[str, tuple[str, str, Mapping[str, Any]]],
    out_dir: str | Path,
    experiment: str,
    metric: str,
) -> list[Path]:
    """pareto_front.png, the grid's cells as ``metric`` against MiB (adapters x codecs), and
    pareto_front.json, the numbers it draws."""
    data = pareto_data(cells, metric)
    front = ", Pareto front" if data["front"] else ""
    fig = pareto_front_figure(data, f"{experiment}: accuracy vs MiB{front}")
    out = Path(out_dir)
    return [
        atomic_write_bytes(out / PARETO_FRONT, save_png(fig)),
        atomic_write_json(out / source_data(PARETO_FRONT), data),
    ]


def write_grid_figure(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | Path, experiment: str
) -> list[Path]:
    """The grid's accuracy-vs-MiB figure, which cell reaches which accuracy for how many MiB,
    and accuracy_vs_mib.json, the curves it draws."""
    fig = pareto(runs, f"{experiment}: accuracy vs MiB transmitted")
    out = Path(out_dir)
    return [
        atomic_write_bytes(out / PARETO, save_png(fig)),
        atomic_write_json(out / source_data(PARETO), curves(runs)),
    ]


def source_data(figure: str) -> str:
    """The JSON file beside a report figure that holds the numbers it draws."""
    return str(Path(figure).with_suffix(".json"))
