"""A partition on disk: the manifest (which sample each client holds) and its statistics.

``manifest.csv`` is ``client_id,sample_index,label``, rows sorted by (client_id,
sample_index): the same partition writes the same bytes. Writes go through a temporary file
and ``os.replace`` (no half-written file is ever seen).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.errors import ConfigError
from fedcore.files import atomic_write_text
from fedcore.partition import MANIFEST_HEADER, Partition, as_labels, check


def write_manifest(partition: Partition, labels: np.ndarray, path: str | Path) -> None:
    """CSV ``client_id,sample_index,label``, rows sorted by (client_id, sample_index)."""
    labels = as_labels(labels)
    rows = [MANIFEST_HEADER]
    for c, ix in enumerate(partition.client_indices):
        rows.extend(f"{c},{i},{y}" for i, y in zip(ix.tolist(), labels[ix].tolist(), strict=True))
    atomic_write_text(path, "\n".join(rows) + "\n")


_INT64_MAX = int(np.iinfo(np.int64).max)  # the columns are int64


def read_manifest(
    path: str | Path, num_samples: int | None = None, labels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The manifest's ``client_id``, ``sample_index`` and ``label`` columns as int64 arrays.

    A malformed file stops in one line naming the file, the row (1-based, the header is row
    1) and the column: a cell that is not an integer >= 0, a ``sample_index`` >= ``num_samples``
    (the split's size) or a ``label`` that differs from ``labels[sample_index]``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path}: not UTF-8 text, so not the CSV `fedapt partition` writes (a binary "
            "file?); re-run fedapt partition"
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{path}: cannot read the manifest ({reason})") from None
    header, _, body = text.partition("\n")
    check(
        header.strip() == MANIFEST_HEADER,
        f"{path}: not a partition manifest (first line {header[:60]!r}, expected {MANIFEST_HEADER!r})",
    )
    columns = MANIFEST_HEADER.split(",")
    lines = body.splitlines()
    data = np.empty((len(lines), 3), dtype=np.int64)
    for r, line in enumerate(lines):
        cells = line.split(",")
        check(
            len(cells) == 3,
            f"{path}: row {r + 2} has {len(cells)} cells, expected 3 ({MANIFEST_HEADER})",
        )
        for c, cell in enumerate(cells):
            cell = cell.strip()
            check(
                cell.isascii() and cell.isdigit(),
                f"{path}: row {r + 2}, column {columns[c]}: {cell[:40]!r} is not an integer >= 0",
            )
            value = int(cell)
            check(
                value <= _INT64_MAX,
                f"{path}: row {r + 2}, column {columns[c]}: {cell[:40]} is too large "
                f"(at most {_INT64_MAX})",
            )
            data[r, c] = value
    if num_samples is not None and len(data):
        r = int(np.argmax(data[:, 1]))
        check(
            int(data[r, 1]) < num_samples,
            f"{path}: row {r + 2}, column sample_index: {int(data[r, 1])} is out of range for "
            f"a train split of {num_samples} samples (0..{num_samples - 1})",
        )
        if labels is not None:
            bad = np.flatnonzero(np.asarray(labels)[data[:, 1]] != data[:, 2])
            if len(bad):
                r = int(bad[0])
                check(
                    False,
                    f"{path}: row {r + 2}, column label: {int(data[r, 2])} but sample "
                    f"{int(data[r, 1])} has label {int(np.asarray(labels)[data[r, 1]])}",
                )
    return data[:, 0].copy(), data[:, 1].copy(), data[:, 2].copy()


# Above this many classes (a decoder's vocabulary: next-token labels) the stats carry no
# per-class counts: a clients x classes table of 1,000 roles x 50,257 GPT-2 tokens would be
# 50M numbers. Each client keeps its size and number of distinct labels.
LABEL_COUNTS_MAX_CLASSES = 1000


def partition_stats(partition: Partition, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """JSON-ready summary: scheme, params, content hash, per-client sizes/labels/noise, totals
    (per-class counts only up to ``LABEL_COUNTS_MAX_CLASSES`` classes)."""
    if num_classes > LABEL_COUNTS_MAX_CLASSES:
        return _compact_stats(partition, as_labels(labels), num_classes)
    counts = partition.label_counts(labels, num_classes)
    sizes = counts.sum(axis=1)
    return {
        "scheme": partition.scheme,
        "params": partition.params,
        "content_hash": partition.content_hash(),
        "num_clients": partition.num_clients,
        "num_classes": num_classes,
        "total_samples": int(sizes.sum()),
        "label_totals": counts.sum(axis=0).tolist(),
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "size_mean": float(sizes.mean()),
        "clients": [
            {
                "client_id": c,
                "size": int(sizes[c]),
                "label_counts": counts[c].tolist(),
                "num_labels": int((counts[c] > 0).sum()),
                "noise_var": float(partition.noise_var[c]),
            }
            for c in range(partition.num_clients)
        ],
    }


def _compact_stats(partition: Partition, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """:func:`partition_stats` without per-class counts (many classes)."""
    sizes = partition.sizes()
    held = [labels[ix] for ix in partition.client_indices]
    every = np.concatenate(held) if held else np.empty(0, dtype=np.int64)
    return {
        "scheme": partition.scheme,
        "params": partition.params,
        "content_hash": partition.content_hash(),
        "num_clients": partition.num_clients,
        "num_classes": num_classes,
        "total_samples": int(sizes.sum()),
        "num_labels": len(np.unique(every)),  # distinct labels held by any client
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "size_mean": float(sizes.mean()),
        "clients": [
            {
                "client_id": c,
                "size": int(sizes[c]),
                "num_labels": len(np.unique(held[c])),
                "noise_var": float(partition.noise_var[c]),
            }
            for c in range(partition.num_clients)
        ],
    }


def write_stats(stats: dict[str, Any], path: str | Path) -> None:
    """Stats as indented JSON with sorted keys (stable bytes for DVC)."""
    atomic_write_text(path, json.dumps(stats, indent=2, sort_keys=True) + "\n")
