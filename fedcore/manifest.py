"""A partition on disk: the manifest (which sample each client holds) and its statistics.

``manifest.csv`` is ``client_id,sample_index,label``, rows sorted by (client_id,
sample_index): the same partition writes the same bytes. Writes go through a temporary file
and ``os.replace`` (no half-written file is ever seen).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.partition import MANIFEST_HEADER, Partition, _as_labels, _check


def _atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the target folder and ``os.replace``: readers never see a
    half-written file, and a failed write leaves no temp file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(partition: Partition, labels: np.ndarray, path: str | Path) -> None:
    """CSV ``client_id,sample_index,label``, rows sorted by (client_id, sample_index)."""
    labels = _as_labels(labels)
    rows = [MANIFEST_HEADER]
    for c, ix in enumerate(partition.client_indices):
        rows.extend(f"{c},{i},{y}" for i, y in zip(ix.tolist(), labels[ix].tolist(), strict=True))
    _atomic_write_text(path, "\n".join(rows) + "\n")


def read_manifest(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The manifest's ``client_id``, ``sample_index`` and ``label`` columns as int64 arrays."""
    text = Path(path).read_text(encoding="utf-8")
    header, _, body = text.partition("\n")
    _check(
        header.strip() == MANIFEST_HEADER,
        f"{path}: not a partition manifest (first line {header[:60]!r}, expected {MANIFEST_HEADER!r})",
    )
    data = np.array([ln.split(",") for ln in body.splitlines()], dtype=np.int64).reshape(-1, 3)
    return data[:, 0].copy(), data[:, 1].copy(), data[:, 2].copy()


def partition_stats(partition: Partition, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """JSON-ready summary: scheme, params, content hash, per-client sizes/labels/noise, totals."""
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


def write_stats(stats: dict[str, Any], path: str | Path) -> None:
    """Stats as indented JSON with sorted keys (stable bytes for DVC)."""
    _atomic_write_text(path, json.dumps(stats, indent=2, sort_keys=True) + "\n")
