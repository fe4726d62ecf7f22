"""The run summary: one record per grid cell, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.errors import ConfigError
from tasks import storage, tracking
from tasks.config import Params
from tasks.io import atomic_write_json, atomic_write_text


def write_summary(params: Params, records: list[dict[str, Any]], path: str) -> str:
    atomic_write_json(
        path, {"experiment": params.experiment.name, "params": params.flat(), "runs": records}
    )
    return path


def cells(params: Params) -> list[str]:
    return [f"{a}-{d}" for a in params.grid.algorithms for d in params.grid.adapters]


def report_baseline(params: Params) -> str:
    """The grid cell the savings are measured against: report.baseline, else FedAvg's first
    cell, else the grid's first cell."""
    grid = cells(params)
    want = params.report.baseline
    if want is not None:
        if want not in grid:
            raise ConfigError(
                f"report.baseline {want!r} is not a grid cell; cells: {', '.join(grid)}"
            )
        return want
    return next((c for c in grid if c.startswith("fedavg-")), grid[0])


def write_comm_cost(params: Params, runs_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """comm_cost.json + comm_cost.md for the grid: cumulative MiB (upload, download, both) to
    first reach each accuracy level, savings against the baseline cell, and per-round traffic
    by phase for runs that freeze layers (FedNILO). Reads each cell's metrics.json rounds."""
    import json

    from fedcore.commcost import (
        comm_cost_markdown,
        comm_cost_report,
        direction_markdown,
        phase_markdown,
        phase_report,
    )

    runs = {}
    for cell in cells(params):
        path = Path(runs_dir) / cell / "metrics.json"
        if not path.is_file():
            raise ConfigError(f"no metrics for grid cell {cell}: {path}")
        runs[cell] = json.loads(path.read_text())["rounds"]
    base = report_baseline(params)
    levels = list(params.report.accuracy_levels)
    rep = comm_cost_report(runs, levels, baseline=base)
    phases = phase_report(runs, base)
    out = Path(out_dir)
    md = [
        f"# Communication cost: {params.experiment.name}",
        "",
        f"Cumulative MiB (upload + download) to first reach each test accuracy; baseline {base}.",
        "",
        comm_cost_markdown(rep, style=params.report.style),
        "Upload and download apart:",
        "",
        direction_markdown(rep),
        phase_markdown(phases, base),
    ]
    return [
        atomic_write_json(out / "comm_cost.json", {**rep, "phases": phases}),
        atomic_write_text(out / "comm_cost.md", "\n".join(md)),
    ]


# Timings (every key train.py keeps out of metrics.json, plus per-round lists) and the
# process a cell ran in: not hashed.
_NOT_EXACT = (
    "wall_seconds",
    "process_seconds",
    "round_seconds",
    "rounds",
    "local_train_seconds_mean",
    "local_train_seconds_per_round",
    "pid",
    "process_name",
)


def write_report(
    params: Params, records: list[dict[str, Any]], out_dir: str | Path, runs_dir: str | Path
) -> list[Path]:
    """The DVC report stage: summary.json without timings or per-round lists, so a rerun
    with the same params and seed writes the same bytes, and the communication-cost report."""
    out = Path(out_dir)
    exact = [{k: v for k, v in r.items() if k not in _NOT_EXACT} for r in records]
    summary = Path(write_summary(params, exact, str(out / "summary.json")))
    return [summary, *write_comm_cost(params, runs_dir, out)]


@task(name="summary", cache_policy=NO_CACHE)
def summary_task(
    params: Params, records: list[dict[str, Any]], path: str, runs_dir: str
) -> list[str]:
    """Write summary.json and the communication-cost report (comm_cost.md/.json) beside it."""
    summary = write_summary(params, records, path)
    return [summary, *map(str, write_comm_cost(params, runs_dir, Path(path).parent))]


@task(name="start-tracking", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def start_tracking_task(experiment: str, flat_params: dict[str, Any]) -> str:
    """Open the experiment's parent MLflow run; returns its id."""
    return tracking.start_experiment_run(experiment, flat_params)


@task(name="end-tracking", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def end_tracking_task(run_id: str) -> None:
    """Close the parent MLflow run."""
    tracking.end_run(run_id)


@task(name="upload-artifacts", retries=2, retry_delay_seconds=3, cache_policy=NO_CACHE)
def upload_task(local_dir: str, bucket: str, prefix: str) -> list[str]:
    """Copy the experiment's outputs to s3://bucket/prefix/ (boto3)."""
    return storage.upload_tree(local_dir, bucket, prefix)
