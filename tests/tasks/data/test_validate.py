"""Shard validation (pandera + great-expectations) on real manifests, valid and tampered."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.manifest import partition_stats, write_manifest, write_stats
from fedcore.partition import make_partition
from tasks.data.validate import ShardValidationError, validate_partition

LABELS = np.repeat(np.arange(10), 100)


def write(tmp_path, scheme="dirichlet_classwise", **opts):
    p = make_partition(scheme, LABELS, num_clients=5, seed=0, **opts)
    write_manifest(p, LABELS, tmp_path / "manifest.csv")
    write_stats(partition_stats(p, LABELS, 10), tmp_path / "stats.json")
    return p


def report(tmp_path):
    return json.loads((tmp_path / "validation.json").read_text())


def test_valid_partition_passes(tmp_path):
    write(tmp_path, beta=0.5, min_size=20)
    validate_partition(tmp_path, num_classes=10, min_size=20)
    assert report(tmp_path)["success"] is True


def test_too_small_shard_names_client(tmp_path):
    p = write(tmp_path, beta=0.5, min_size=1)
    smallest = int(np.argmin(p.sizes()))
    with pytest.raises(ShardValidationError, match="validation.json"):
        validate_partition(tmp_path, num_classes=10, min_size=int(p.sizes().max()))
    fails = report(tmp_path)["failures"]
    assert any(
        f["client_id"] == smallest and f["observed"] == int(p.sizes()[smallest]) for f in fails
    )


def test_sample_in_two_shards_and_bad_label(tmp_path):
    write(tmp_path, beta=0.5)
    lines = (tmp_path / "manifest.csv").read_text().splitlines()
    cid, idx, lab = lines[1].split(",")
    lines.append(f"4,{idx},{lab}")  # the same sample again, on client 4
    lines.append("3,5000,12")  # a label outside the 10 classes
    (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ShardValidationError):
        validate_partition(tmp_path, num_classes=10)
    fails = report(tmp_path)["failures"]
    kinds = " ".join(f["expectation"] for f in fails)
    assert "field_uniqueness" in kinds or "unique" in kinds
    assert "in_range" in kinds
    # counts no longer match the statistics for clients 3 and 4
    pair = [f for f in fails if f["expectation"] == "expect_column_pair_values_to_be_equal"]
    assert {f["client_id"] for f in pair} == {3, 4}


def test_requested_skew_is_checked(tmp_path):
    write(tmp_path, scheme="labels_per_client", m=2)
    stats = json.loads((tmp_path / "stats.json").read_text())
    stats["clients"][1]["num_labels"] = 3
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(ShardValidationError, match="client 1"):
        validate_partition(tmp_path, num_classes=10)
