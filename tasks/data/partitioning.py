"""The experiment's client partition: drawn from the selected train rows (once per process
for the same data, options and seed), written as ``manifest.csv`` + ``stats.json`` with the
data selection it was drawn from, read back with its hash checked, and checked against the
current data selection (IO lives here, math in ``fedcore.partition``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedcore.errors import ConfigError
from fedcore.lm import WindowDataset
from fedcore.manifest import partition_stats, read_manifest, write_manifest, write_stats
from fedcore.partition import Partition, make_partition
from tasks.config import Params
from tasks.data.experiment import ExperimentData
from tasks.io import missing


def data_selection(params: Params, data: ExperimentData) -> dict[str, Any]:
    """What a partition was drawn from: the dataset and a sha256 of the selected train rows
    (data.train_subset and experiment.seed decide them). Written to stats.json and checked by
    preflight against the current params, so a partition of other rows is refused. With
    data.validation, train_rows are the clients' rows and the validation rows are recorded
    too."""
    rows = np.ascontiguousarray(np.asarray(data.train_idx, dtype=np.int64))
    out: dict[str, Any] = {
        "dataset": params.data.dataset,
        "train_subset": params.data.train_subset,
        "seed": params.experiment.seed,
        "train_rows": int(len(rows)),
        "train_rows_sha256": hashlib.sha256(rows.tobytes()).hexdigest(),
    }
    if params.data.validation > 0.0:  # recorded only when set: stats.json stays as it was
        held = np.ascontiguousarray(np.asarray(data.val_idx, dtype=np.int64))
        out["validation"] = params.data.validation
        out["validation_rows"] = int(len(held))
        out["validation_rows_sha256"] = hashlib.sha256(held.tobytes()).hexdigest()
    return out


def check_partition_data(
    params: Params, data: ExperimentData, partition_dir: str | Path, part: Partition
) -> None:
    """The partition in ``partition_dir`` must be for this data selection: refused in one
    line naming what differs. Partitions written before stats.json recorded the selection
    are accepted when every row they hold is a row of the current selection."""
    stats_path = Path(partition_dir) / "stats.json"
    stats = _read_stats(stats_path)
    recorded = stats.get("data_selection")
    if isinstance(recorded, dict):
        current = data_selection(params, data)
        keys = ("dataset", "train_subset", "seed", "validation", "train_rows", "train_rows_sha256")
        unset = {"validation": 0.0}  # what a selection without the key had
        diff = [k for k in keys if recorded.get(k, unset.get(k)) != current.get(k, unset.get(k))]
        if diff:
            shown = (
                ", ".join(
                    f"{k} {recorded.get(k, unset.get(k))!r} (now {current.get(k, unset.get(k))!r})"
                    for k in diff
                    if k != "train_rows_sha256"
                )
                or "the selected train rows differ"
            )
            raise ConfigError(
                f"--partition {partition_dir}: built for another data selection: {shown}; "
                f"re-run: fedapt partition --out {partition_dir} (with these params)"
            )
        _no_validation_rows(params, data, partition_dir, part)
        return
    if stats.get("dataset", params.data.dataset) != params.data.dataset:
        raise ConfigError(
            f"--partition {partition_dir}: built for dataset {stats.get('dataset')!r}, params "
            f"ask for {params.data.dataset!r}; re-run: fedapt partition --out {partition_dir}"
        )
    held = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in part.client_indices])
    if not np.isin(held, data.train_idx).all():
        raise ConfigError(
            f"--partition {partition_dir}: holds rows outside the current data selection "
            f"(data.train_subset {params.data.train_subset}, experiment.seed "
            f"{params.experiment.seed}); re-run: fedapt partition --out {partition_dir}"
        )


def _no_validation_rows(
    params: Params, data: ExperimentData, partition_dir: str | Path, part: Partition
) -> None:
    """No client shard may hold a validation row (data.validation): one line if one does."""
    if not len(data.val_idx):
        return
    held = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in part.client_indices])
    leaked = np.intersect1d(held, data.val_idx)
    if len(leaked):
        raise ConfigError(
            f"--partition {partition_dir}: client shards hold {len(leaked)} rows of the "
            f"validation split (data.validation {params.data.validation}), e.g. row "
            f"{int(leaked[0])}; re-run: fedapt partition --out {partition_dir}"
        )


def build_partition(params: Params, data: ExperimentData) -> Partition:
    """Partition the experiment's train rows; indices refer to the full train split (a run
    draws it once, in ``flows.plan.prepare``; the partition task writes that draw)."""
    return _draw_partition(params, data)


def _draw_partition(params: Params, data: ExperimentData) -> Partition:
    labels = data.train.labels.numpy()[data.train_idx]
    p = params.partition
    if p.num_clients > len(labels):
        raise ConfigError(
            f"partition.num_clients: {p.num_clients} clients but only {len(labels)} training samples"
        )
    groups = None  # a dataset's natural clients (next-token windows: their speaking roles)
    if isinstance(data.train, WindowDataset):
        groups = data.train.groups.numpy()[data.train_idx]
    part = make_partition(
        p.scheme,
        labels,
        num_clients=p.num_clients,
        seed=params.experiment.seed,
        options=p.options,
        groups=groups,
    )
    # Map positions in the subset back to rows of the dataset so the manifest is self-contained.
    mapped = tuple(np.sort(data.train_idx[ix]) for ix in part.client_indices)
    return Partition(part.scheme, part.params, mapped, part.noise_var)


def write_partition(
    params: Params, data: ExperimentData, part: Partition, out_dir: str | Path
) -> tuple[Path, Path]:
    """Write ``manifest.csv``, ``stats.json`` and the clients x classes figure
    ``label_histogram.png``; returns the first two's paths."""
    from tasks.results.figures import write_label_histogram

    out = Path(out_dir)
    labels = data.train.labels.numpy()
    manifest, stats_path = out / "manifest.csv", out / "stats.json"
    selection = data_selection(params, data)  # the rows the draw was made from
    write_manifest(part, labels, manifest)
    stats = partition_stats(part, labels, data.train.info.num_classes)
    stats["dataset"] = params.data.dataset
    stats["data_selection"] = selection
    if isinstance(data.train, WindowDataset) and "groups" in part.params:
        names = data.train.group_names  # the natural clients' names (speaking roles)
        stats["client_groups"] = [names[g] for g in part.params["groups"]]
    write_stats(stats, stats_path)
    write_label_histogram(out)  # from stats.json: what MLflow and `dvc plots show` display
    return manifest, stats_path


def shards_of(part: Partition) -> list[np.ndarray]:
    return [np.asarray(ix, dtype=np.int64) for ix in part.client_indices]


def _read_stats(path: Path) -> dict[str, Any]:
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
            f"re-run: fedapt partition --out {path.parent}"
        ) from None
    if not isinstance(stats, dict):
        raise ConfigError(f"{path}: not a partition's stats.json (a JSON object expected)")
    return stats


def load_partition(
    partition_dir: str | Path,
    num_samples: int | None = None,
    labels: np.ndarray | None = None,
) -> Partition:
    """Rebuild a Partition from ``manifest.csv`` + ``stats.json`` and check its hash; with
    ``num_samples`` (the train split's size) and ``labels`` (its labels), every row's
    sample_index and label are checked against the data (one line naming the row)."""
    d = Path(partition_dir)
    manifest, stats_path = d / "manifest.csv", d / "stats.json"
    if not (manifest.is_file() and stats_path.is_file()):
        what = "is a file, not a partition's folder" if d.is_file() else "holds no partition"
        if not d.exists():
            what = missing(d)  # a link loop is named as one
        raise ConfigError(
            f"--partition {d} {what}: it needs manifest.csv and stats.json (make them with: "
            f"fedapt partition --out {d})"
        )
    stats = _read_stats(stats_path)
    cid, idx, _ = read_manifest(manifest, num_samples=num_samples, labels=labels)
    try:
        n = int(stats["num_clients"])
        noise = tuple(float(c["noise_var"]) for c in stats["clients"])
        scheme, options = str(stats["scheme"]), stats["params"]
        hash_ = stats["content_hash"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{stats_path}: missing or malformed field {exc}; re-run: fedapt partition --out {d}"
        ) from None
    if len(noise) != n or (len(cid) and (int(cid.min()) < 0 or int(cid.max()) >= n)):
        raise ConfigError(
            f"{manifest}: client_id outside 0..{n - 1} or stats.json lists "
            f"{len(noise)} clients for num_clients {n}; re-run: fedapt partition --out {d}"
        )
    parts = tuple(np.sort(idx[cid == c]) for c in range(n))
    part = Partition(scheme, options, parts, noise)
    if part.content_hash() != hash_:
        raise ConfigError(
            f"{manifest}: content hash differs from {stats_path}; re-run fedapt partition"
        )
    return part


@task(name="partition", cache_policy=NO_CACHE)
def partition_task(params: Params, out_dir: str, data: ExperimentData, part: Partition) -> str:
    """Write the client shards ``part`` (the run's plan's draw, written as drawn) of the
    experiment's ``data``: manifest.csv + stats.json."""
    write_partition(params, data, part, out_dir)
    return out_dir
