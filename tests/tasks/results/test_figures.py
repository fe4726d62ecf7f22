"""The figures fedapt logs to MLflow and declares as DVC image plots: drawn from the records,
the same records give the same PNG bytes, and each shows what its name says."""

from __future__ import annotations

import numpy as np

from tasks.results import figures

PNG = b"\x89PNG\r\n\x1a\n"


def rounds(n: int = 6, phases: bool = False) -> list[dict]:
    out = []
    for i in range(1, n + 1):
        r = {
            "round": i,
            "accuracy": 0.1 * i if i % 2 == 0 or i == n else None,
            "upload_bytes": 2**20,
            "download_bytes": 2**21,
            "cum_upload_bytes": i * 2**20,
            "cum_download_bytes": i * 2**21,
            "extra": {"freeze_index": float(i > 3)} if phases else {},
        }
        out.append(r)
    return out


def test_cell_figures_are_pngs_and_reproducible():
    figs = figures.cell_figures(rounds(), "fedavg-full")
    assert sorted(figs) == ["accuracy_vs_mib.png", "accuracy_vs_round.png"]
    first = {k: figures.save_png(v) for k, v in figures.cell_figures(rounds(), "c").items()}
    again = {k: figures.save_png(v) for k, v in figures.cell_figures(rounds(), "c").items()}
    assert first == again and all(b.startswith(PNG) for b in first.values())
    assert b"Software" not in first["accuracy_vs_round.png"]  # no version in the bytes


def test_accuracy_curves_plot_only_evaluated_rounds_in_percent():
    fig = figures.accuracy_vs_round(rounds(), "t")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [2, 4, 6]
    assert np.allclose(line.get_ydata(), [20, 40, 60])
    fig = figures.accuracy_vs_mib(rounds(), "t")
    total, up, down = fig.axes[0].get_lines()
    assert np.allclose(total.get_xdata(), [6, 12, 18])  # MiB: up + down
    assert np.allclose(up.get_xdata(), [2, 4, 6]) and np.allclose(down.get_xdata(), [4, 8, 12])


def test_phase_figure_only_for_runs_with_phases():
    assert figures.traffic_by_phase(rounds(), "t") is None
    figs = figures.cell_figures(rounds(phases=True), "fednilo-full")
    assert "traffic_by_phase.png" in figs
    texts = [t.get_text() for t in figs["traffic_by_phase.png"].axes[0].texts]
    assert texts == ["freeze_index 0", "freeze_index 1"]


def test_label_histogram_and_pareto():
    counts = np.arange(12).reshape(3, 4)
    fig = figures.label_histogram(counts, "h")
    assert np.array_equal(fig.axes[0].get_images()[0].get_array(), counts)
    fig = figures.pareto({"a": rounds(), "b": rounds(2), "none": []}, "p")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["a", "b"]
    assert figures.save_png(fig).startswith(PNG)


def test_a_cell_run_has_its_files_figures_and_partition_in_mlflow(tmp_path, monkeypatch):
    from pathlib import Path

    from mlflow import MlflowClient

    from tasks.config import load_params
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition, write_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import run_cell

    repo = Path(__file__).resolve().parents[3]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    p = load_params(
        repo / "params.yaml",
        [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            f"data.root={repo / 'data/raw'}",
            "data.train_subset=200",
            "data.test_subset=50",
            "partition.num_clients=3",
            "partition.dirichlet_classwise.min_size=5",
            "federation.rounds=2",
            "client.max_steps=2",
            "runtime.workers=0",
            "runtime.tracking=true",
            "storage.bucket=null",
        ],
    )
    data = load_experiment_data(p)
    write_partition(p, data, build_partition(p, data), tmp_path / "partition")
    record = run_cell(cell_of(p, data), tmp_path / "partition", tmp_path / "cell")
    client = MlflowClient(uri)

    def listing(path=None):
        out = []
        for a in client.list_artifacts(record["mlflow_run_id"], path):
            out += listing(a.path) if a.is_dir else [a.path]
        return out

    files = set(listing())
    assert {
        "metrics.json",
        "rounds.csv",
        "figures/accuracy_vs_round.png",
        "figures/accuracy_vs_mib.png",
        "partition/stats.json",
        "partition/label_histogram.png",
    } <= files, files
    assert (tmp_path / "cell" / "figures" / "accuracy_vs_mib.png").read_bytes().startswith(PNG)


def test_progress_lines_carry_an_eta():
    import io

    from rich.console import Console

    from fedcore.events import RoundRecord
    from tasks.results.progress import RichProgress

    buf = io.StringIO()
    bar = RichProgress("fedavg-full", Console(file=buf, force_terminal=False, width=200))
    bar.on_fit_start({"rounds": 3})
    for r, secs in ((1, 10.0), (2, 20.0), (3, 5.0)):
        bar.on_round_end(RoundRecord(r, 0.1, (0,), 2**20, 2**20, r, r, 0.5, 0.5, 0.7, 0, secs))
    lines = buf.getvalue().splitlines()
    assert "(10.0 s, ETA 0:00:20)" in lines[0]  # two rounds left at 10 s each
    assert "(20.0 s, ETA 0:00:15)" in lines[1]  # one left at the mean, 15 s
    assert "ETA" not in lines[2]


def _clipped(fig) -> list[str]:
    """The titles, axis labels, legend entries and annotations that reach past the figure's
    edge once laid out."""
    fig.draw_without_rendering()  # constrained layout runs at draw time
    page = fig.bbox
    out = []
    for ax in fig.axes:
        legend = ax.get_legend()
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += [*legend.get_texts(), legend.get_title()] if legend else []
        for t in texts:
            box = t.get_window_extent()
            if t.get_text() and (
                box.x0 < page.x0 or box.x1 > page.x1 + 0.5 or box.y1 > page.y1 + 0.5
            ):
                out.append(t.get_text())
    return out


def test_upload_and_download_both_show_when_they_coincide():
    same = [{**r, "cum_download_bytes": r["cum_upload_bytes"]} for r in rounds()]
    fig = figures.accuracy_vs_mib(same, "t")
    _, up, down = fig.axes[0].get_lines()
    assert np.allclose(up.get_xdata(), down.get_xdata())  # the same curve...
    assert (up.get_marker(), down.get_marker()) == ("^", "v")  # ...drawn with its own markers
    assert up.get_linestyle() != down.get_linestyle() and up.get_markerfacecolor() == "none"
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["upload + download", "upload (= download)", "download (= upload)"]
    labels = [
        t.get_text()
        for t in figures.accuracy_vs_mib(rounds(), "t").axes[0].get_legend().get_texts()
    ]
    assert labels == ["upload + download", "upload", "download"]  # unequal: no note


def test_grid_figure_labels_fit_the_figure():
    names = ["fedavg-houlsby", "fedavg-pfeiffer", "fedavg-lora", "fedavg-accumulator_pa"]
    title = "label-skew-m3-random-base-seed-sweep-of-the-long-name: accuracy vs MiB transmitted"
    fig = figures.pareto({n: rounds(4 + i) for i, n in enumerate(names)}, title)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == names
    assert _clipped(fig) == []  # labels, legend and title inside the figure
    assert "\n" in ax.get_title()  # a long title wraps
