"""Validated client shards: a pandera schema over the manifest and a great-expectations suite
over per-client statistics. A failure stops the flow before any training, with a report of
which client failed which expectation and the observed value (``validation.json``).

``check_shards`` applies the same rules before a run starts (``flows.plan.prepare``), with
pandera alone and without writing anything: a partition the flow's validation would refuse is
refused in one line naming the file and its first offending row (the manifest's, or the
client's entry of stats.json), or, for a partition drawn by the run, the setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.errors import ConfigError, FedaptError
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


# ---- the same rules before the run: pandera, one line, nothing written -----------------------


def shard_schema(num_clients: int, num_classes: int | None) -> Any:
    """pandera, the rules of ``manifest_schema`` as named checks: ``client_id`` in range,
    every ``sample_index`` on one row only (a repeat is the offending row, not the first
    occurrence), ``label`` in range (``num_classes`` None: not checked here)."""
    import pandera.pandas as pa

    label = [] if num_classes is None else [_between(0, num_classes - 1, "label")]
    return pa.DataFrameSchema(
        {
            "client_id": pa.Column(int, _between(0, num_clients - 1, "client")),
            "sample_index": pa.Column(
                int, [_between(0, None, "index"), pa.Check(lambda s: ~s.duplicated(), name="once")]
            ),
            "label": pa.Column(int, label),
        },
        strict=True,
        coerce=False,
    )


def _between(low: int, high: int | None, name: str) -> Any:
    """A pandera check ``low <= x <= high`` (``high`` None: no upper bound) under ``name``
    (the built-in checks report their own names, not the one given)."""
    import pandera.pandas as pa

    if high is None:
        return pa.Check(lambda s: s >= low, name=name)
    return pa.Check(lambda s: (s >= low) & (s <= high), name=name)


def client_schema(stats: dict[str, Any], min_size: int) -> Any:
    """pandera, the great-expectations suite of ``_expectations`` over ``client_frame``: each
    client at least max(1, ``min_size``) samples, its stats.json size the manifest's count,
    exactly m labels (labels_per_client), noise variances strictly increasing
    (gaussian_noise)."""
    import pandera.pandas as pa

    least = max(1, min_size)
    num_labels: list[Any] = []
    if stats["scheme"] == "labels_per_client":
        m = int(stats["params"]["m"])
        num_labels = [_between(m, m, "labels")]
    noise: list[Any] = []
    if stats["scheme"] == "gaussian_noise":
        noise = [pa.Check(_increasing, name="increasing")]
    return pa.DataFrameSchema(
        {
            "client_id": pa.Column(int),
            "size": pa.Column(int, _between(least, None, "size")),
            "manifest_count": pa.Column(int),
            "num_labels": pa.Column(int, num_labels),
            "noise_var": pa.Column(float, noise),
        },
        checks=[pa.Check(lambda d: d["size"] == d["manifest_count"], name="count")],
        strict=True,
        coerce=False,
    )


def _increasing(s: pd.Series) -> pd.Series:
    """Each value above the one before it (the first: a number); a NaN fails, as in
    great-expectations' strictly increasing."""
    ok = s.diff() > 0
    if len(ok):
        ok.iloc[0] = not pd.isna(s.iloc[0])
    return ok


def _first_failure(err: Any) -> tuple[int | None, str, str]:
    """(row, check, column) of pandera's first failure: the lowest row (a check of the whole
    frame, or of a column's type, has none and comes first)."""
    cases = err.failure_cases
    rows = pd.to_numeric(cases["index"], errors="coerce")
    at = rows.fillna(-1).sort_values(kind="stable").index[0]
    row = None if pd.isna(rows[at]) else int(rows[at])
    return row, str(cases.loc[at, "check"]), str(cases.loc[at, "column"])


def check_shards(
    manifest: pd.DataFrame,
    stats: dict[str, Any],
    num_classes: int | None,
    min_size: int,
    *,
    manifest_name: str,
    stats_name: str,
    fix: str,
) -> None:
    """The flow's shard validation before the run (pandera, nothing written): one
    ``ConfigError`` naming the first offending manifest row (``manifest_name``, row 2 the
    first after the header) or client (``stats_name``'s ``clients`` entry), then ``fix``.
    ``manifest`` is in the file's row order; ``stats`` as ``fedcore.manifest.partition_stats``
    writes it."""
    import pandera.errors

    n = int(stats["num_clients"])
    try:
        shard_schema(n, num_classes).validate(manifest, lazy=True)
    except pandera.errors.SchemaErrors as err:
        row, check, column = _first_failure(err)
        problem = _row_problem(manifest, row, check, column, n, num_classes, manifest_name)
        raise ConfigError(f"{problem}; {fix}") from None
    listed = stats.get("clients")
    if not isinstance(listed, list) or len(listed) != n:
        shown = len(listed) if isinstance(listed, list) else "no list of"
        raise ConfigError(f"{stats_name}: lists {shown} clients for num_clients {n}; {fix}")
    try:
        frame, schema = client_frame(manifest, stats), client_schema(stats, min_size)
    except (KeyError, TypeError, ValueError) as exc:  # a field the rules read
        raise ConfigError(
            f"{stats_name}: missing or malformed field {exc} in its clients; {fix}"
        ) from None
    try:
        schema.validate(frame, lazy=True)
    except pandera.errors.SchemaErrors as err:
        row, check, column = _first_failure(err)
        raise ConfigError(
            _client_problem(frame, row, check, column, stats, min_size, stats_name, manifest_name)
            + f"; {fix}"
        ) from None


def _row_problem(
    manifest: pd.DataFrame,
    row: int | None,
    check: str,
    column: str,
    num_clients: int,
    num_classes: int | None,
    name: str,
) -> str:
    if row is None:
        return f"{name}: column {column}: {check}"
    at = f"{name}: row {row + 2}"
    value = int(manifest[column].iloc[row]) if column in manifest else None
    if check == "once":
        first = int(np.flatnonzero(manifest["sample_index"].to_numpy() == value)[0])
        return (
            f"{at}, column sample_index: sample {value} is on client "
            f"{int(manifest['client_id'].iloc[row])} and on client "
            f"{int(manifest['client_id'].iloc[first])} (row {first + 2}); a sample belongs to "
            "one client"
        )
    if check == "client":
        return (
            f"{at}, column client_id: {value} is outside 0..{num_clients - 1} "
            f"(num_clients {num_clients})"
        )
    if check == "label" and num_classes is not None:
        return f"{at}, column label: {value} is outside 0..{num_classes - 1}"
    return f"{at}, column {column}: {value} fails {check}"


def _client_problem(
    frame: pd.DataFrame,
    row: int | None,
    check: str,
    column: str,
    stats: dict[str, Any],
    min_size: int,
    name: str,
    manifest_name: str,
) -> str:
    if row is None:
        return f"{name}: clients: column {column}: {check}"
    c = frame.iloc[row]
    at = f"{name}: client {int(c['client_id'])}"
    if check == "size":
        need = (
            f"validation.min_shard_size is {min_size}"
            if min_size > 1
            else "every client needs at least 1"
        )
        return f"{at} holds {int(c['size'])} samples; {need}"
    if check == "count":
        return (
            f"{at} has size {int(c['size'])}, but {manifest_name} holds "
            f"{int(c['manifest_count'])} rows of client {int(c['client_id'])}"
        )
    if check == "labels":
        m = stats["params"]["m"]
        return (
            f"{at} holds {int(c['num_labels'])} labels; partition.labels_per_client.m asks "
            f"for exactly {m}"
        )
    if check == "not_nullable" or (check == "increasing" and row == 0):
        return f"{at} has {column} {c[column]}, not a number"
    if check == "increasing":
        before = frame.iloc[row - 1]
        return (
            f"{at} has noise_var {float(c['noise_var'])}, not above client "
            f"{int(before['client_id'])}'s {float(before['noise_var'])} (gaussian_noise: "
            "strictly increasing)"
        )
    return f"{at}: column {column} fails {check}"


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
