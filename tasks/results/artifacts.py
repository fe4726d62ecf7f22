"""The files and figures of each MLflow run's Artifacts tab (the PNGs are drawn beside the
outputs by ``tasks.results.figures``; DVC declares them as image plots, which render offline).

A cell's MLflow run gets ``metrics.json`` and ``rounds.csv``, its figures (accuracy per round,
accuracy vs cumulative MiB, FedNILO's traffic by phase), and the partition it trained on
(``stats.json``, ``validation.json``, the clients x classes label histogram). The experiment's
parent run gets the summary, the communication-cost report and the grid's accuracy-vs-MiB
figure. MLflow gets copies of the files in the output folders.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.grid import record_cell
from tasks.results.figures import (
    FIGURES,
    LABEL_HISTOGRAM,
    PARETO,
    PARETO_FRONT,
    source_data,
    write_label_histogram,
)


def _log(client: Any, run_id: str, path: Path, artifact_path: str | None = None) -> None:
    if path.is_file():
        client.log_artifact(run_id, str(path), artifact_path)


def log_cell(run_id: str, cell_dir: str | Path, partition_dir: str | Path) -> None:
    """A cell's files, figures and partition into its MLflow run's artifacts."""
    from tasks import tracking  # here: the stages that only draw need no MLflow

    client = tracking.client()
    cell, part = Path(cell_dir), Path(partition_dir)
    for name in ("metrics.json", "rounds.csv"):
        _log(client, run_id, cell / name)
    for png in sorted((cell / FIGURES).glob("*.png")):
        _log(client, run_id, png, FIGURES)
    for name in ("stats.json", "validation.json", LABEL_HISTOGRAM):
        _log(client, run_id, part / name, "partition")
    if not (part / LABEL_HISTOGRAM).is_file() and (part / "stats.json").is_file():
        # a partition written before figures existed: drawn for MLflow only (the folder may
        # be another stage's DVC output, never written here)
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(part / "stats.json", Path(tmp) / "stats.json")
            _log(client, run_id, write_label_histogram(tmp), "partition")


def log_experiment(
    run_id: str, experiment_dir: str | Path, seeds: Sequence[int] | None = None
) -> None:
    """The experiment's summary, communication-cost report and grid figures into the parent
    run; in a seed sweep (``seeds``) also each seed's, under ``seed-<s>/``."""
    from tasks import tracking

    client = tracking.client()
    d = Path(experiment_dir)
    grid_figures = (PARETO, PARETO_FRONT)  # each with the JSON of the numbers it draws
    names = ("summary.json", "results.md", "comm_cost.md", "comm_cost.json", *grid_figures)
    names += tuple(source_data(f) for f in grid_figures)
    for name in names:
        _log(client, run_id, d / name)
    for seed in seeds or ():
        for name in names:
            _log(client, run_id, d / f"seed-{seed}" / name, f"seed-{seed}")


def run_links(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """cell -> the URL of its run in the MLflow UI, in the training view (an http tracking
    server only; never a password: the links are stored in the Prefect artifact)."""
    from tasks import tracking

    uri = tracking.tracking_uri()
    ids = {record_cell(r): r.get("mlflow_run_id") for r in records}
    if not uri.startswith("http") or not any(ids.values()):
        return {}
    client = tracking.client()
    links = {}
    for cell, run_id in ids.items():
        if run_id:
            exp = client.get_run(run_id).info.experiment_id
            links[cell] = tracking.run_url(exp, run_id, uri)
    return links


def runs_table_link(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The MLflow Runs table of the records' experiment run (training view, one row per
    cell, the results as columns: ``tracking.runs_table_url``); None without an http
    tracking server or a tracked cell."""
    from tasks import tracking

    uri = tracking.tracking_uri()
    if not uri.startswith("http"):
        return None
    parent = tracking.parent_run(records)
    return tracking.runs_table_url(parent) if parent else None
