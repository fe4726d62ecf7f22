"""Partition invariants on synthetic labels (hand-checkable)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.partition import (
    list_partitioners,
    make_partition,
    partition_stats,
    read_manifest,
    write_manifest,
    write_stats,
)

LABELS = np.repeat(np.arange(10), 600)  # 6,000 samples, 600 per class
OPTIONS = {
    "iid": {},
    "dirichlet_classwise": {"beta": 0.5},
    "dirichlet_clientwise": {"alpha": 0.5},
    "labels_per_client": {"m": 3},
    "gaussian_noise": {"sigma": 0.1},
    "quantity_normal": {"rel_std": 0.3},
    "quantity_dirichlet": {"beta": 0.5},
}


def test_every_scheme_has_test_options():
    assert sorted(OPTIONS) == list_partitioners()


@pytest.mark.parametrize("scheme", list_partitioners())
def test_disjoint_covering_deterministic(scheme):
    p = make_partition(scheme, LABELS, num_clients=10, seed=1, **OPTIONS[scheme])
    allidx = np.concatenate(p.client_indices)
    assert len(allidx) == len(np.unique(allidx))  # disjoint
    dropped = p.params.get("dropped_classes", [])
    assert len(allidx) == int(np.isin(LABELS, dropped, invert=True).sum())  # covering
    assert all(np.all(np.diff(ix) > 0) for ix in p.client_indices)  # sorted
    again = make_partition(scheme, LABELS, num_clients=10, seed=1, **OPTIONS[scheme])
    assert again.content_hash() == p.content_hash()
    other = make_partition(scheme, LABELS, num_clients=10, seed=2, **OPTIONS[scheme])
    assert other.content_hash() != p.content_hash()


@pytest.mark.parametrize("m", [1, 2, 3, 10])
def test_labels_per_client_exactly_m(m):
    p = make_partition("labels_per_client", LABELS, num_clients=10, seed=0, m=m)
    counts = p.label_counts(LABELS, 10)
    assert ((counts > 0).sum(axis=1) == m).all()


def test_classwise_dirichlet_follows_beta():
    big = make_partition("dirichlet_classwise", LABELS, num_clients=5, seed=0, beta=1e4)
    share = big.label_counts(LABELS, 10) / 600  # each class spread ~evenly: 1/5 each
    assert np.allclose(share, 0.2, atol=0.03)
    small = make_partition(
        "dirichlet_classwise", LABELS, num_clients=10, seed=0, beta=0.05, min_size=1
    )
    top = np.sort(small.label_counts(LABELS, 10), axis=0)[-2:].sum(axis=0) / 600
    assert np.median(top) > 0.9  # most of each class sits on two clients
    assert small.sizes().min() >= 1


def test_classwise_mean_share_is_uniform():
    acc = np.zeros((5, 10))
    for seed in range(40):
        acc += make_partition(
            "dirichlet_classwise", LABELS, num_clients=5, seed=seed, beta=0.5, min_size=0
        ).label_counts(LABELS, 10)
    # E[p_kj] = 1/N for a symmetric Dirichlet: average over classes and 40 draws.
    assert np.allclose((acc / 40 / 600).mean(axis=1), 0.2, atol=0.03)


def test_min_size_respected():
    p = make_partition("dirichlet_classwise", LABELS, num_clients=20, seed=3, beta=0.3, min_size=50)
    assert p.sizes().min() >= 50


def test_clientwise_dirichlet_alpha():
    flat = make_partition("dirichlet_clientwise", LABELS, num_clients=10, seed=0, alpha=1e4)
    counts = flat.label_counts(LABELS, 10)
    assert (counts > 0).all()  # everyone holds every class
    assert np.allclose(counts[0] / 600, 0.1, atol=0.04)  # the first client's mix ~ prior
    sharp = make_partition("dirichlet_clientwise", LABELS, num_clients=10, seed=0, alpha=0.01)
    counts = sharp.label_counts(LABELS, 10)
    dominant = counts.max(axis=1) / counts.sum(axis=1)
    assert np.median(dominant) > 0.6
    assert (sharp.sizes() == 600).all()  # equal sizes by default


def test_gaussian_noise_variance():
    p = make_partition("gaussian_noise", LABELS, num_clients=4, seed=0, sigma=0.2)
    assert np.allclose(p.noise_var, [0.0, 0.05, 0.1, 0.15])  # sigma * i / N
    assert np.all(np.diff(p.noise_var) > 0)


def test_quantity_normal_spread():
    labels = np.repeat(np.arange(10), 2000)
    p = make_partition("quantity_normal", labels, num_clients=100, seed=0, rel_std=0.3)
    s = p.sizes()
    assert s.sum() == len(labels)
    assert 0.2 < s.std() / s.mean() < 0.4


@pytest.mark.parametrize(
    ("scheme", "opts", "needle"),
    [
        ("dirichlet_classwise", {"beta": 0}, "beta"),
        ("dirichlet_classwise", {"beta": -1}, "beta"),
        ("dirichlet_clientwise", {"alpha": 0}, "alpha"),
        ("labels_per_client", {"m": 0}, "m must be in [1, 10]"),
        ("labels_per_client", {"m": 11}, "m must be in [1, 10]"),
        ("iid", {"beta": 1}, "not an option of iid"),
        ("gaussian_noise", {"sigma": -1}, "sigma"),
    ],
)
def test_bad_options(scheme, opts, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        make_partition(scheme, LABELS, num_clients=10, seed=0, **opts)


def test_more_clients_than_samples_and_unknown_scheme():
    with pytest.raises(ConfigError, match="num_clients"):
        make_partition("iid", LABELS[:5], num_clients=10, seed=0)
    with pytest.raises(UnknownNameError, match="dirichlet_classwise"):
        make_partition("zipf", LABELS, num_clients=10, seed=0)


def test_manifest_roundtrip_and_byte_identical(tmp_path):
    p = make_partition("dirichlet_classwise", LABELS, num_clients=10, seed=0, beta=0.5)
    path = tmp_path / "out" / "manifest.csv"
    write_manifest(p, LABELS, path)
    first = path.read_bytes()
    write_manifest(p, LABELS, path)
    assert path.read_bytes() == first
    assert sorted(x.name for x in path.parent.iterdir()) == ["manifest.csv"]  # no temp files
    cid, idx, lab = read_manifest(path)
    for c, ix in enumerate(p.client_indices):
        assert np.array_equal(idx[cid == c], ix)
    assert np.array_equal(lab, LABELS[idx])
    stats = partition_stats(p, LABELS, 10)
    write_stats(stats, tmp_path / "stats.json")
    back = json.loads((tmp_path / "stats.json").read_text())
    assert back["content_hash"] == p.content_hash() and back["num_clients"] == 10
    assert [c["size"] for c in back["clients"]] == p.sizes().tolist()
