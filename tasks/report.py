"""The run summary: one record per grid cell, written atomically."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.config import Params
from tasks.io import atomic_write_json


def write_summary(params: Params, records: list[dict[str, Any]], path: str) -> str:
    atomic_write_json(
        path, {"experiment": params.experiment.name, "params": params.flat(), "runs": records}
    )
    return path


@task(name="summary", cache_policy=NO_CACHE)
def summary_task(spec: dict[str, Any], records: list[dict[str, Any]], path: str) -> str:
    """Write summary.json for the experiment."""
    return write_summary(Params.model_validate(spec), records, path)
