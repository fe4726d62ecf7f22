"""Validated client shards: a pandera schema over the manifest and a great-expectations suite
over per-client statistics. A failure stops the flow before any training, with a report of
which client failed which expectation and the observed value (``validation.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.errors import FedaptError
from tasks.io import atomic_write_json


class ShardValidationError(FedaptError):
    """The partition violates an expectation; the report file says where."""


def manifest_schema(num_clients: int, num_classes: int) -> Any:
    """pandera: client ids and labels in range, every sample in exactly one shard."""
    import pandera.pandas as pa

    return pa.DataFrameSchema(
        {
            "client_id": pa.Column(int, pa.Check.in_range(0, num_clients - 1)),
            "sample_index": pa.Column(int, [pa.Check.ge(0)], unique=True),
            "label": pa.Column(int, pa.Check.in_range(0, num_classes - 1)),
        },
        strict=True,
        coerce=False,
    )


def client_frame(manifest: pd.DataFrame, stats: dict[str, Any]) -> pd.DataFrame:
    counts = manifest.groupby("client_id").size()
    rows = []
    for c in stats["clients"]:
        cid = int(c["client_id"])
        rows.append(
            {
                "client_id": cid,
                "size": int(c["size"]),
                "manifest_count": int(counts.get(cid, 0)),
                "num_labels": int(c["num_labels"]),
                "noise_var": float(c["noise_var"]),
            }
        )
    return pd.DataFrame(rows)


def _expectations(stats: dict[str, Any], min_size: int) -> list[Any]:
    import great_expectations as gx

    e = gx.expectations
    out = [
        e.ExpectColumnValuesToBeBetween(column="size", min_value=max(1, min_size)),
        e.ExpectColumnPairValuesToBeEqual(column_A="size", column_B="manifest_count"),
    ]
    scheme, params = stats["scheme"], stats["params"]
    if scheme == "labels_per_client":  # the requested skew: exactly m labels everywhere
        m = int(params["m"])
        out.append(e.ExpectColumnValuesToBeBetween(column="num_labels", min_value=m, max_value=m))
    if scheme == "gaussian_noise":
        out.append(e.ExpectColumnValuesToBeIncreasing(column="noise_var", strictly=True))
    return out


def run_expectations(frame: pd.DataFrame, stats: dict[str, Any], min_size: int) -> list[dict]:
    """great-expectations 1.x, ephemeral context; returns one failure row per bad client."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        ctx.data_sources.add_pandas("fedapt")
        .add_dataframe_asset("client_stats")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = ctx.suites.add(gx.ExpectationSuite(name="client_shards"))
    for exp in _expectations(stats, min_size):
        suite.add_expectation(exp)
    vd = ctx.validation_definitions.add(
        gx.ValidationDefinition(name="shards", data=batch, suite=suite)
    )
    result = vd.run(batch_parameters={"dataframe": frame}, result_format="COMPLETE")
    failures = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
        for i in r.result.get("unexpected_index_list") or [None]:
            failures.append(
                {
                    "client_id": None if i is None else int(frame["client_id"].iloc[int(i)]),
                    "expectation": cfg.type,
                    "kwargs": {k: str(v) for k, v in kwargs.items()},
                    "observed": None if i is None else _observed(frame, int(i), kwargs),
                }
            )
    return failures


def _observed(frame: pd.DataFrame, i: int, kwargs: dict[str, Any]) -> Any:
    cols = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    values = {c: frame[c].iloc[i].item() for c in cols}  # column dtype kept (ints stay ints)
    return values if len(values) > 1 else next(iter(values.values()))


def validate_partition(
    partition_dir: str | Path, num_classes: int, min_size: int = 1, out: str | Path | None = None
) -> Path:
    """Validate manifest.csv + stats.json in ``partition_dir``; writes the report to ``out``
    (default: validation.json beside the manifest)."""
    import json

    import pandera.errors

    d = Path(partition_dir)
    stats = json.loads((d / "stats.json").read_text())
    manifest = pd.read_csv(d / "manifest.csv", dtype=np.int64)
    failures: list[dict[str, Any]] = []
    try:
        manifest_schema(int(stats["num_clients"]), num_classes).validate(manifest, lazy=True)
    except pandera.errors.SchemaErrors as err:
        for _, f in err.failure_cases.head(50).iterrows():
            idx = f.get("index")
            cid = None if idx is None or pd.isna(idx) else int(manifest.iloc[int(idx)]["client_id"])
            failures.append(
                {
                    "client_id": cid,
                    "expectation": f"manifest: {f['check']}",
                    "kwargs": {"column": str(f["column"])},
                    "observed": str(f["failure_case"]),
                }
            )
    failures += run_expectations(client_frame(manifest, stats), stats, min_size)
    report = {
        "partition_hash": stats["content_hash"],
        "success": not failures,
        "num_clients": stats["num_clients"],
        "failures": failures,
    }
    path = atomic_write_json(out or d / "validation.json", report)
    if failures:
        first = failures[0]
        raise ShardValidationError(
            f"shard validation failed ({len(failures)} problem(s)); first: client "
            f"{first['client_id']} {first['expectation']} observed {first['observed']}; "
            f"report: {path}"
        )
    return path


@task(name="validate-shards", cache_policy=NO_CACHE)
def validate_task(
    partition_dir: str, num_classes: int, min_size: int, out: str | None = None
) -> str:
    """Check the client shards (pandera + great-expectations) before any training; the
    report goes to ``out`` (default: validation.json beside the manifest)."""
    return str(validate_partition(partition_dir, num_classes, min_size, out))
