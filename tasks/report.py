"""The run summary: one record per grid cell, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks import storage, tracking
from tasks.config import Params
from tasks.io import atomic_write_json


def write_summary(params: Params, records: list[dict[str, Any]], path: str) -> str:
    atomic_write_json(
        path, {"experiment": params.experiment.name, "params": params.flat(), "runs": records}
    )
    return path


_NOT_EXACT = ("wall_seconds", "process_seconds", "round_seconds", "rounds")


def write_report(params: Params, records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """The DVC report stage: summary.json without timings or per-round lists, so a rerun
    with the same params and seed writes the same bytes."""
    out = Path(out_dir)
    exact = [{k: v for k, v in r.items() if k not in _NOT_EXACT} for r in records]
    return [Path(write_summary(params, exact, str(out / "summary.json")))]


@task(name="summary", cache_policy=NO_CACHE)
def summary_task(spec: dict[str, Any], records: list[dict[str, Any]], path: str) -> str:
    """Write summary.json for the experiment."""
    return write_summary(Params.model_validate(spec), records, path)


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
