"""What ``flows.plan.prepare`` checks of a run's files before anything starts: the partition
(every rule of the flow's shard validation, ``tasks.data.validate``, with pandera) and the cells'
checkpoints (their fingerprint, then every tensor against the cell's model). A refusal is one
``ConfigError`` naming the file and the first offending row or tensor; nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedcore.errors import ConfigError
from fedcore.manifest import partition_stats, read_manifest
from fedcore.partition import Partition
from tasks.config import Params
from tasks.data.experiment import ExperimentData
from tasks.data.partitioning import check_partition_data, load_partition
from tasks.data.validate import check_shards
from tasks.grid import ResolvedCell
from tasks.io import missing
from tasks.training import checkpoint

# ---- partitions -------------------------------------------------------------------------------


def check_given_partition(params: Params, data: ExperimentData, partition_dir: str | Path) -> None:
    """``--partition DIR`` as the flow's validation would see it (``tasks.data.validate``): each
    row of manifest.csv (its cells, sample range and label, read by ``read_manifest``; every
    sample on one client; client ids and labels in range) and each client of stats.json (at
    least ``validation.min_shard_size`` samples, as many as the manifest holds, the scheme's
    own rules). One line naming the file and the first offending row or client."""
    d = Path(partition_dir)
    manifest_path, stats_path = d / "manifest.csv", d / "stats.json"
    fix = f"re-run: fedapt partition --out {d}"
    if not (manifest_path.is_file() and stats_path.is_file()):
        return  # load_partition says what is missing, and how to make it
    try:
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        int(stats["num_clients"]), str(stats["scheme"]), dict(stats["params"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{stats_path}: unreadable or malformed ({type(exc).__name__}: {reason}); {fix}"
        ) from None
    labels = data.train.labels.numpy()
    cid, idx, y = read_manifest(manifest_path, num_samples=len(labels), labels=labels)
    manifest = pd.DataFrame({"client_id": cid, "sample_index": idx, "label": y})
    check_shards(
        manifest,
        stats,
        data.num_classes,
        params.validation.min_shard_size,
        manifest_name=str(manifest_path),
        stats_name=str(stats_path),
        fix=fix,
    )


def given_partition(params: Params, data: ExperimentData, partition_dir: str | Path) -> Partition:
    """``--partition DIR`` read and checked: every row and client as the flow's validation
    would see them (``check_given_partition``), drawn over the rows ``params`` select, and of
    the scheme and client count ``params`` ask for."""
    check_given_partition(params, data, partition_dir)  # every row and client, the flow's rules
    labels = data.train.labels.numpy()
    part = load_partition(partition_dir, num_samples=len(labels), labels=labels)
    check_partition_data(params, data, partition_dir, part)  # another subset -> one line
    want = (params.partition.scheme, params.partition.num_clients)
    if (part.scheme, part.num_clients) != want:
        raise ConfigError(
            f"--partition {partition_dir} is {part.scheme} over {part.num_clients} clients, "
            f"not partition.scheme {want[0]} over partition.num_clients {want[1]}; re-run: "
            f"fedapt partition --out {partition_dir} (with these params)"
        )
    return part


def check_drawn_partition(params: Params, data: ExperimentData, part: Partition) -> None:
    """The partition a run drew, as the flow's validation will see it once written: a client
    below ``validation.min_shard_size`` (or with another label count than the scheme's m)
    -> one line naming the setting, before anything is written."""
    labels = data.train.labels.numpy()
    stats = partition_stats(part, labels, data.train.info.num_classes)
    cid = np.concatenate(
        [np.full(len(ix), c, dtype=np.int64) for c, ix in enumerate(part.client_indices)]
    )
    idx = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in part.client_indices])
    manifest = pd.DataFrame({"client_id": cid, "sample_index": idx, "label": labels[idx]})
    p = params.partition
    check_shards(
        manifest,
        stats,
        data.num_classes,
        params.validation.min_shard_size,
        manifest_name="the drawn manifest",
        stats_name=(
            f"partition.{p.scheme} over {p.num_clients} clients (experiment.seed "
            f"{params.experiment.seed})"
        ),
        fix="lower validation.min_shard_size, or change the partition options or num_clients",
    )


# ---- checkpoints ------------------------------------------------------------------------------


def check_checkpoints(
    cells: Sequence[ResolvedCell],
    partition_hash: str,
    directory: str | Path,
    model_of: Callable[[str], nn.Module],
) -> list[str]:
    """Every cell checkpoint in ``directory`` must be for this configuration (its
    fingerprint, read once) and hold the cell's model: the same tensors, each of the model's
    shape and dtype, and every tensor of the algorithm's state and the codecs' memory kept
    per model tensor of that tensor's shape. ``model_of(adapter)``: the cell's initial model
    (only its tensors' shapes and dtypes are read). Returns the cells that will resume."""
    paths = {c.name: Path(directory) / f"{c.name}.pt" for c in cells}
    for path in paths.values():  # resuming or not: the cell writes its checkpoint there
        if path.is_symlink() and not path.exists():  # a link to a checkpoint now gone
            raise ConfigError(
                f"checkpoint {path} {missing(path)}; delete the link or point it at the "
                "checkpoint to resume from"
            )
        if path.exists() and not path.is_file():
            raise ConfigError(
                f"checkpoint {path} is a folder (or another non-file), not a checkpoint file; "
                "delete it: the cell writes its checkpoint there"
            )
    resuming = []
    for cell in cells:
        path = paths[cell.name]
        if not cell.params.runtime.resume or not path.is_file():
            continue
        if cell.params.model.base == "pretrain" and not (cell.base and Path(cell.base).is_file()):
            continue  # the base is written by the run: the cell checks its checkpoint then
        _check_readable(path)
        state = checkpoint.read(path, checkpoint.fingerprint(cell, partition_hash))
        if state is None:
            continue
        check_tensors(path, state, model_of(cell.adapter).state_dict(), cell.name)
        resuming.append(cell.name)
    return resuming


def _check_readable(path: Path) -> None:
    """A checkpoint file that is empty or not the zip archive ``torch.save`` writes (a torn
    or foreign file): one line saying so, before ``torch.load``'s own message (its
    ``weights_only`` advice, which does not apply) would."""
    import zipfile

    fix = f"delete {path} or run with --set runtime.resume=false to start the cell over"
    if path.stat().st_size == 0:
        raise ConfigError(f"checkpoint {path} is empty (0 bytes: a torn write?); {fix}")
    if not zipfile.is_zipfile(path):
        raise ConfigError(
            f"checkpoint {path} is not a checkpoint file (not the zip archive torch.save "
            f"writes); {fix}"
        )


def check_tensors(path: Path, state: Any, model: dict[str, torch.Tensor], cell: str) -> None:
    """The checkpoint's engine state (``Simulation.state_dict``) against the cell's model:
    one line naming ``path`` and the first tensor that differs."""
    fix = f"delete {path} or run with --set runtime.resume=false to start the cell over"

    def refuse(what: str) -> ConfigError:
        return ConfigError(f"checkpoint {path}: {what} (cell {cell}); {fix}")

    held = state.get("global_state") if isinstance(state, dict) else None
    if not isinstance(held, dict):
        raise refuse("no global model (global_state) in its state")
    missing = [k for k in model if k not in held]
    extra = [k for k in held if k not in model]
    if missing or extra:
        shown = ", ".join(
            [f"{k} (missing)" for k in missing[:3]] + [f"{k} (not in the model)" for k in extra[:3]]
        )
        raise refuse(f"its model has other tensors than the cell's: {shown}")
    for key, want in model.items():
        got = held[key]
        if not isinstance(got, torch.Tensor):
            raise refuse(f"global_state.{key} is a {type(got).__name__}, not a tensor")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise refuse(
                f"tensor global_state.{key} is {_shape(got)}, the cell's model has {_shape(want)}"
            )
    for where, key, got in _per_tensor(state, ("algorithm", "codec_memory")):
        want = model.get(key)
        if want is not None and got.shape != want.shape:
            raise refuse(
                f"tensor {where} has shape {tuple(got.shape)}, the cell's model's {key} "
                f"{tuple(want.shape)}"
            )


def _per_tensor(state: dict[str, Any], sections: tuple[str, ...]) -> Iterator[tuple[str, str, Any]]:
    """(where, key, tensor) of every tensor kept under a string key in ``state``'s
    ``sections`` at any depth (FedOpt's moments, SCAFFOLD's controls, error-feedback
    memories: keyed by the model tensor they go with)."""
    stack: list[tuple[str, Any]] = [(s, state.get(s)) for s in sections]
    while stack:
        where, value = stack.pop(0)
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, torch.Tensor):
                    yield f"{where}.{k}", str(k), v
                else:
                    stack.append((f"{where}.{k}", v))
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))


def _shape(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
