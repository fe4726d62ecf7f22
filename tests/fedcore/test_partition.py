"""Partitioners on synthetic labels: invariants for every registered scheme, then each scheme's
statistics against hand-computed values, the errors, and the manifest / stats files."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import stat
import warnings

import numpy as np
import pytest
import torch

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.manifest import partition_stats, read_manifest, write_manifest, write_stats
from fedcore.options import dump, option_names
from fedcore.partition import (
    PARTITIONERS,
    Partition,
    client_sizes,
    dirichlet_classwise,
    iid,
    make_partition,
    scheme_options_type,
)
from tests.helpers import toy_data

LABELS = np.repeat(np.arange(10), 600)  # 6,000 samples, class k at indices 600k .. 600k+599
OPTIONS = {
    "iid": {},
    "dirichlet_classwise": {"beta": 0.5},
    "dirichlet_clientwise": {"alpha": 0.5},
    "labels_per_client": {"m": 3},
    "gaussian_noise": {"sigma": 0.1},
    "quantity_normal": {"rel_std": 0.3},
    "quantity_dirichlet": {"beta": 0.5},
    "natural": {"min_samples": 1},
}
GROUPS = (np.arange(6000) * 7) % 10  # ten natural clients of 600 samples, interleaved


def part(scheme: str, num_clients: int = 10, seed: int = 0, labels=LABELS, **opts) -> Partition:
    if scheme == "natural":  # the one scheme that reads the samples' groups
        opts.setdefault("groups", GROUPS)
    return make_partition(scheme, labels, num_clients=num_clients, seed=seed, **opts)


def test_every_scheme_has_test_options():
    assert sorted(OPTIONS) == sorted(PARTITIONERS)


# ---- invariants of every scheme --------------------------------------------------------------


@pytest.mark.parametrize("scheme", sorted(PARTITIONERS))
def test_disjoint_covering_sorted_deterministic(scheme):
    p = part(scheme, seed=1, **OPTIONS[scheme])
    assert p.num_clients == 10 and len(p.noise_var) == 10
    assert all(ix.dtype == np.int64 and np.all(np.diff(ix) > 0) for ix in p.client_indices)
    everything = np.concatenate(p.client_indices)
    assert len(everything) == len(np.unique(everything))  # disjoint
    dropped = p.params.get("dropped_classes", [])
    assert np.array_equal(np.sort(everything), np.flatnonzero(~np.isin(LABELS, dropped)))
    assert p.sizes().sum() == len(everything) and p.sizes().min() >= 1
    assert part(scheme, seed=1, **OPTIONS[scheme]).content_hash() == p.content_hash()
    assert part(scheme, seed=2, **OPTIONS[scheme]).content_hash() != p.content_hash()


@pytest.mark.parametrize("scheme", sorted(PARTITIONERS))
def test_params_record_every_option_and_survive_json(scheme):
    p = part(scheme, seed=3, **OPTIONS[scheme])
    assert {"num_clients": 10, "seed": 3}.items() <= p.params.items()
    assert set(option_names(scheme_options_type(scheme))) <= set(p.params)  # defaults too
    # load_partition rebuilds a Partition from stats.json: the hash must not change.
    back = Partition(p.scheme, json.loads(json.dumps(p.params)), p.client_indices, p.noise_var)
    assert back.content_hash() == p.content_hash()


def test_scheme_options():
    def names(scheme: str) -> list[str]:
        return option_names(scheme_options_type(scheme))

    assert names("iid") == []
    assert names("dirichlet_classwise") == ["beta", "min_size"]
    assert names("dirichlet_clientwise") == ["alpha", "sizes", "size_rel_std", "size_beta"]
    assert names("labels_per_client") == ["m"]


def test_content_hash_is_the_documented_encoding():
    p = Partition(
        "iid", {"seed": 0, "num_clients": 2}, (np.array([0, 2]), np.array([1])), (0.0, 0.5)
    )
    h = hashlib.sha256(b'{"params": {"num_clients": 2, "seed": 0}, "scheme": "iid"}')
    for ix, var in [([0, 2], "0.0"), ([1], "0.5")]:
        h.update(len(ix).to_bytes(8, "little"))
        h.update(b"".join(i.to_bytes(8, "little") for i in ix))
        h.update(var.encode())
    assert p.content_hash() == h.hexdigest()


# ---- iid, noise, #M --------------------------------------------------------------------------


def test_iid_is_array_split_of_a_permutation():
    p = part("iid", num_clients=7)
    assert p.sizes().tolist() == [858, 857, 857, 857, 857, 857, 857]  # 6000 = 7 * 857 + 1
    assert np.allclose(p.label_counts(LABELS, 10) / p.sizes()[:, None], 0.1, atol=0.04)


def test_gaussian_noise_variance_is_sigma_i_over_n():
    p = part("gaussian_noise", num_clients=4, sigma=0.2)
    # exactly seed 000's formula for clients C_1..C_N: the last client gets sigma
    assert p.noise_var == tuple(0.2 * i / 4 for i in range(1, 5))
    assert np.allclose(p.noise_var, [0.05, 0.1, 0.15, 0.2])
    same_split = part("iid", num_clients=4)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(p.client_indices, same_split.client_indices, strict=True)
    )


# Gaussian feature noise (seed 000 §IV: clients C_1..C_N), down to the noisy batches
def test_gaussian_noise_clients_are_c1_to_cn_and_batches_have_that_variance():
    labels = np.tile(np.arange(2), 250)
    part = make_partition("gaussian_noise", labels, num_clients=5, seed=0, sigma=0.5)
    # C_i of N gets variance sigma * i / N, i = 1..N: the last client gets sigma, none is clean
    assert part.noise_var == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5))
    data = toy_data(500, size=12)
    for k in (0, 4):
        idx = torch.as_tensor(part.client_indices[k], dtype=torch.int64)  # 100 images
        clean, _ = data.batch(idx)
        gen = torch.Generator().manual_seed(k)
        noisy, _ = data.batch(idx, noise_var=part.noise_var[k], generator=gen)
        # sample variance of 14,400 draws: relative std sqrt(2 / n) ~ 1.2%
        assert float((noisy - clean).var()) == pytest.approx(0.5 * (k + 1) / 5, rel=0.05)


@pytest.mark.parametrize(("num_clients", "m"), [(10, 1), (10, 2), (10, 3), (10, 10), (100, 2)])
def test_labels_per_client_gives_exactly_m_labels(num_clients, m):
    p = part("labels_per_client", num_clients=num_clients, m=m)
    counts = p.label_counts(LABELS, 10)
    assert ((counts > 0).sum(axis=1) == m).all()
    held = counts > 0  # each class split evenly over its holders (np.array_split: +-1)
    for k in range(10):
        shares = counts[held[:, k], k]
        assert shares.sum() == 600 and shares.max() - shares.min() <= 1


def test_labels_per_client_hand_checked_and_dropped_classes():
    p = part("labels_per_client", num_clients=2, m=1)  # client i holds class i mod 10 only
    assert np.array_equal(p.client_indices[0], np.arange(0, 600))
    assert np.array_equal(p.client_indices[1], np.arange(600, 1200))
    assert p.params["dropped_classes"] == [2, 3, 4, 5, 6, 7, 8, 9]
    p = part("labels_per_client", num_clients=20, m=1)  # every class on clients k and k+10
    assert p.sizes().tolist() == [300] * 20 and p.params["dropped_classes"] == []


def test_labels_per_client_refuses_a_class_too_small_to_share():
    labels = np.array([0] * 50 + [1] * 2)  # class 1 cannot be shared by 5 clients
    with pytest.raises(ConfigError, match=r"labels_per_client\.m: class 1 has 2 samples"):
        part("labels_per_client", num_clients=10, labels=labels, m=1)


# ---- class-wise Dirichlet (NIID-Bench labeldir) ----------------------------------------------


def test_classwise_large_beta_is_near_uniform_small_beta_concentrates():
    share = part("dirichlet_classwise", num_clients=5, beta=1e4).label_counts(LABELS, 10) / 600
    assert np.allclose(share, 0.2, atol=0.03)  # each class ~1/N on every client
    small = part("dirichlet_classwise", beta=0.05, min_size=1)
    top2 = np.sort(small.label_counts(LABELS, 10), axis=0)[-2:].sum(axis=0) / 600
    assert np.median(top2) > 0.9  # most of each class sits on two clients


def test_classwise_mean_share_of_class_k_on_client_j_is_one_over_n():
    acc = np.zeros((5, 10))
    for seed in range(100):
        acc += part("dirichlet_classwise", 5, seed, beta=0.5, min_size=0).label_counts(LABELS, 10)
    mean_share = acc / 100 / 600  # E[p_kj] = 1/N for a symmetric Dirichlet
    assert np.allclose(mean_share, 0.2, atol=0.08)  # per (client, class): sd ~0.02
    assert np.allclose(mean_share.mean(axis=1), 0.2, atol=0.02)


def test_classwise_min_size_holds_and_is_checked():
    assert part("dirichlet_classwise", 20, 3, beta=0.3, min_size=50).sizes().min() >= 50
    with pytest.raises(ConfigError, match=re.escape("min_size: must be less than or equal to 600")):
        part("dirichlet_classwise", beta=0.5, min_size=601)
    impossible = np.repeat([0, 1], 50)  # 4 clients x exactly 25 each from Dir(0.01) draws
    with pytest.raises(ConfigError, match="min_size: no draw .* lower min_size or raise beta"):
        part("dirichlet_classwise", 4, labels=impossible, beta=0.01, min_size=25)


def test_classwise_tiny_beta_never_divides_by_zero():
    # Dir(1e-3) puts all mass on a few clients, often exactly 0.0 elsewhere; when that mass
    # lands only on clients the balancing step closed, NIID-Bench divides 0/0 (NaN cuts).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(5):  # seeds 1-3 hit 0/0 in the unguarded code
            p = part("dirichlet_classwise", 10, seed, beta=1e-3, min_size=0)
            assert p.sizes().sum() == 6000 and p.sizes().max() <= 1200  # at most 2 classes


def test_classwise_dirichlet_balancing_closes_full_clients():
    """NIID-Bench labeldir balancing: before class k is cut, a client already holding >= n/N
    samples gets no share of class k; with a small beta that happens, so it is exercised."""
    labels = np.repeat(np.arange(10), 100)  # n = 1000, N = 5: a client closes at >= 200
    closures = 0
    for seed in range(10):
        p = make_partition("dirichlet_classwise", labels, num_clients=5, seed=seed, beta=0.1)
        counts = p.label_counts(labels, 10)  # (clients, classes)
        before = np.cumsum(counts, axis=1) - counts  # each client's size before class k
        closed = before >= 1000 / 5
        assert (counts[closed] == 0).all(), seed  # a closed client gets nothing of class k
        closures += int(closed.sum())
        # so no client grows past n/N + one class (100) minus one sample
        assert p.sizes().max() < 200 + 100
    assert closures > 0  # the balancing step did close clients


# ---- client-wise Dirichlet (Hsu et al.) ------------------------------------------------------


def test_clientwise_alpha_controls_the_mix_and_sizes_stay_as_drawn():
    def top2(p: Partition) -> np.ndarray:  # share of each client's two largest classes
        counts = p.label_counts(LABELS, 10)
        return np.sort(counts, axis=1)[:, -2:].sum(axis=1) / counts.sum(axis=1)

    flat = part("dirichlet_clientwise", alpha=1e4)
    gap = np.abs(flat.label_counts(LABELS, 10) / 600 - 0.1)  # every client ~ the prior 0.1;
    assert gap.mean() < 0.02 and gap.max() < 0.08  # the last client takes the leftovers
    assert top2(flat).max() < 0.3
    sharp = part("dirichlet_clientwise", alpha=0.01)
    assert np.median(top2(sharp)) > 0.8  # most clients: 1-2 dominant classes
    assert sharp.sizes().tolist() == [600] * 10  # sizes="equal" by default


@pytest.mark.parametrize(("sizes", "opts"), [("normal", {"size_rel_std": 0.3}), ("dirichlet", {})])
def test_clientwise_size_schemes(sizes, opts):
    p = part("dirichlet_clientwise", 20, alpha=1.0, sizes=sizes, **opts)
    assert p.sizes().sum() == 6000 and p.sizes().min() >= 1 and len(set(p.sizes())) > 1


# ---- quantity skew ---------------------------------------------------------------------------


def test_quantity_normal_spread_matches_rel_std():
    labels = np.repeat(np.arange(10), 2000)
    s = part("quantity_normal", 100, labels=labels, rel_std=0.3).sizes()
    assert s.sum() == 20000 and 0.2 < s.std() / s.mean() < 0.4
    assert part("quantity_normal", 7, rel_std=0.0).sizes().tolist() == [858] + [857] * 6
    wide = part("quantity_normal", 50, rel_std=3.0, min_size=20).sizes()  # many clipped draws
    assert wide.sum() == 6000 and wide.min() >= 20


def test_quantity_dirichlet_min_size():
    s = part("quantity_dirichlet", 20, beta=0.5, min_size=30).sizes()
    assert s.sum() == 6000 and s.min() >= 30
    with pytest.raises(ConfigError, match="quantity_dirichlet.min_size: no Dir"):
        part("quantity_dirichlet", 10, beta=0.01, min_size=500)


def test_client_sizes_equal_is_largest_remainder():
    rng = np.random.default_rng(0)
    assert client_sizes(10, 3, rng, "equal", 0.0, 1, "k").tolist() == [4, 3, 3]
    assert client_sizes(10, 3, rng, "normal", 0.0, 1, "k").tolist() == [4, 3, 3]


# ---- errors: one line, naming the parameter and its range ------------------------------------

CW = "partition.dirichlet_classwise"


@pytest.mark.parametrize(
    ("scheme", "opts", "message"),
    [
        ("dirichlet_classwise", {"beta": 0}, f"{CW}.beta: must be greater than 0 (got 0)"),
        ("dirichlet_classwise", {"beta": -1.0}, f"{CW}.beta: must be greater than 0 (got -1.0)"),
        ("dirichlet_classwise", {"beta": float("nan")}, f"{CW}.beta: must be a finite number (got nan)"),
        ("dirichlet_classwise", {"beta": float("inf")}, f"{CW}.beta: must be a finite number (got inf)"),
        ("dirichlet_classwise", {"beta": float("-inf")}, f"{CW}.beta: must be a finite number (got -inf)"),
        ("dirichlet_classwise", {"beta": "0.5"}, f"{CW}.beta: must be a valid number (got '0.5')"),
        ("dirichlet_classwise", {"beta": "3"}, f"{CW}.beta: must be a valid number (got '3')"),
        ("dirichlet_classwise", {"beta": True}, f"{CW}.beta: must be a valid number (got True)"),
        ("dirichlet_classwise", {"beta": None}, f"{CW}.beta: must be a valid number (got None)"),
        ("dirichlet_classwise", {"min_size": -1}, f"{CW}.min_size: must be greater than or equal to 0 (got -1)"),
        ("dirichlet_classwise", {"min_size": "3"}, f"{CW}.min_size: must be a valid integer (got '3')"),
        ("dirichlet_classwise", {"min_size": True}, f"{CW}.min_size: must be a valid integer (got True)"),
        ("dirichlet_classwise", {"min_size": 3.0}, f"{CW}.min_size: must be a valid integer (got 3.0)"),
        ("dirichlet_classwise", {"min_size": 601}, f"{CW}.min_size: must be less than or equal to 600 = 6000 samples // 10 clients (got 601)"),
        ("dirichlet_clientwise", {"alpha": 0}, "partition.dirichlet_clientwise.alpha: must be greater than 0 (got 0)"),
        ("dirichlet_clientwise", {"sizes": "lognormal"}, "sizes: must be 'equal', 'normal' or 'dirichlet' (got 'lognormal')"),
        ("dirichlet_clientwise", {"size_rel_std": -1}, "size_rel_std: must be greater than or equal to 0 (got -1)"),
        ("dirichlet_clientwise", {"size_beta": 0.0}, "size_beta: must be greater than 0 (got 0.0)"),
        ("labels_per_client", {"m": 0}, "partition.labels_per_client.m: must be greater than or equal to 1 (got 0)"),
        ("labels_per_client", {"m": 11}, "labels_per_client.m: must be less than or equal to 10, the number of classes (got 11)"),
        ("labels_per_client", {"m": 2.5}, "labels_per_client.m: must be a valid integer (got 2.5)"),
        ("labels_per_client", {"m": True}, "labels_per_client.m: must be a valid integer (got True)"),
        ("gaussian_noise", {"sigma": -1}, "partition.gaussian_noise.sigma: must be greater than or equal to 0 (got -1)"),
        ("gaussian_noise", {"sigma": "0.1"}, "partition.gaussian_noise.sigma: must be a valid number (got '0.1')"),
        ("quantity_normal", {"rel_std": -0.1}, "partition.quantity_normal.rel_std: must be greater than or equal to 0"),
        ("quantity_normal", {"min_size": 0}, "partition.quantity_normal.min_size: must be greater than or equal to 1"),
        ("quantity_dirichlet", {"beta": 0}, "partition.quantity_dirichlet.beta: must be greater than 0 (got 0)"),
        ("quantity_dirichlet", {"min_size": 601}, "quantity_dirichlet.min_size: must be less than or equal to 600"),
        ("iid", {"beta": 1}, "unknown key 'partition.iid.beta'; allowed: none"),
        ("dirichlet_classwise", {"alpha": 1}, f"unknown key '{CW}.alpha'; allowed: beta, min_size"),
        ("dirichlet_clientwise", {"beta": 1}, "allowed: alpha, sizes, size_rel_std, size_beta"),
    ],
)  # fmt: skip
def test_bad_options(scheme, opts, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        part(scheme, **opts)
    assert "\n" not in str(err.value)


def test_direct_calls_validate_options_like_make_partition():
    labels = LABELS[:100]
    with pytest.raises(ConfigError, match=re.escape(f"{CW}.beta: must be greater than 0 (got -1)")):
        dirichlet_classwise(labels, 10, 0, beta=-1)
    with pytest.raises(ConfigError, match=re.escape(f"unknown key '{CW}.m'; allowed: beta")):
        dirichlet_classwise(labels, 10, 0, m=2)
    direct = dirichlet_classwise(labels, 10, 0, beta=1, min_size=1)
    via = part("dirichlet_classwise", labels=labels, beta=1.0, min_size=1)
    assert direct.content_hash() == via.content_hash()
    assert direct.params["beta"] == 1.0 and type(direct.params["beta"]) is float  # int -> float


@pytest.mark.parametrize("scheme", sorted(PARTITIONERS))
def test_options_type_is_derived_from_the_signature_and_pickles(scheme):
    cls = scheme_options_type(scheme)
    assert list(dump(cls())) == option_names(cls)
    assert cls.__qualname__ == f"{scheme}.Options"
    assert pickle.loads(pickle.dumps(cls())) == cls()


def test_make_partition_takes_typed_options_or_a_mapping():
    cls = scheme_options_type("dirichlet_classwise")
    want = part("dirichlet_classwise", beta=2.0, min_size=3).content_hash()
    typed = cls(beta=2.0, min_size=3)
    assert part("dirichlet_classwise", options=typed).content_hash() == want
    assert part("dirichlet_classwise", options={"beta": 2, "min_size": 3}).content_hash() == want
    assert part("dirichlet_classwise", options=cls(beta=2.0), min_size=3).content_hash() == want
    with pytest.raises(ConfigError, match=re.escape(f"{CW}.beta: must be greater than 0 (got -1)")):
        part("dirichlet_classwise", options=cls(beta=-1))  # built by hand: still checked
    other = scheme_options_type("quantity_dirichlet")()
    with pytest.raises(ConfigError, match=re.escape(f"{CW}: must be a mapping of options")):
        part("dirichlet_classwise", options=other)


def test_bad_clients_seed_labels_and_scheme():
    with pytest.raises(
        ConfigError, match=re.escape("partition.num_clients: must be an integer in [1, 5] (got 10)")
    ):
        part("iid", labels=LABELS[:5])
    with pytest.raises(
        ConfigError, match=re.escape("num_clients: must be an integer in [1, 6000] (got 0)")
    ):
        part("dirichlet_classwise", num_clients=0)
    with pytest.raises(
        ConfigError, match=re.escape("partition.seed: must be an integer >= 0 (got -1)")
    ):
        part("iid", seed=-1)
    with pytest.raises(ConfigError, match="1-D array of integers >= 0"):
        part("iid", labels=LABELS.astype(float))
    with pytest.raises(
        UnknownNameError, match="unknown partition scheme 'zipf'; valid: dirichlet_classwise"
    ):
        part("zipf")  # fmt: skip


# ---- manifest and stats ----------------------------------------------------------------------


def test_manifest_roundtrip_byte_identical_and_atomic(tmp_path):
    p = part("dirichlet_classwise", beta=0.5)
    path = tmp_path / "out" / "nested" / "manifest.csv"  # parents are created
    write_manifest(p, LABELS, path)
    first = path.read_bytes()
    assert first.startswith(b"client_id,sample_index,label\n0,")
    write_manifest(part("dirichlet_classwise", beta=0.5), LABELS, path)
    assert path.read_bytes() == first
    assert [x.name for x in path.parent.iterdir()] == ["manifest.csv"]  # no temp files left
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    cid, idx, lab = read_manifest(path)
    assert cid.dtype == idx.dtype == lab.dtype == np.int64
    assert np.all(np.diff(cid) >= 0) and len(idx) == 6000
    for c, ix in enumerate(p.client_indices):
        assert np.array_equal(idx[cid == c], ix)
    assert np.array_equal(lab, LABELS[idx])


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "manifest.csv"
    write_manifest(part("iid"), LABELS, path)
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_manifest(part("iid", seed=1), LABELS, path)
    assert path.read_bytes() == before and [x.name for x in tmp_path.iterdir()] == ["manifest.csv"]


def test_read_manifest_rejects_other_files(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ConfigError, match="not a partition manifest"):
        read_manifest(path)


def test_stats_fields_and_values(tmp_path):
    p = part("labels_per_client", num_clients=2, m=1)
    stats = partition_stats(p, LABELS, 10)
    assert stats["scheme"] == "labels_per_client" and stats["num_clients"] == 2
    assert stats["content_hash"] == p.content_hash() and stats["params"] == p.params
    assert stats["total_samples"] == 1200 and stats["label_totals"] == [600, 600] + [0] * 8
    assert (stats["size_min"], stats["size_max"], stats["size_mean"]) == (600, 600, 600.0)
    assert stats["clients"][1] == {
        "client_id": 1,
        "size": 600,
        "label_counts": [0, 600] + [0] * 8,
        "num_labels": 1,
        "noise_var": 0.0,
    }
    path = tmp_path / "stats.json"
    write_stats(stats, path)
    first = path.read_bytes()
    write_stats(partition_stats(p, LABELS, 10), path)
    assert path.read_bytes() == first and json.loads(first) == stats
    noisy = partition_stats(part("gaussian_noise", num_clients=4, sigma=0.2), LABELS, 10)
    assert [c["noise_var"] for c in noisy["clients"]] == [0.2 * i / 4 for i in range(1, 5)]


@pytest.mark.parametrize(
    "labels, match",
    [
        (np.array([0, 1, -1, 2]), "integers >= 0"),
        (np.array([0.0, 1.0]), "integers >= 0"),
        (np.zeros((2, 2), dtype=int), "1-D"),
    ],
)
def test_partition_labels_are_checked(labels, match):
    with pytest.raises(ConfigError, match=match):
        iid(labels, 2, 0)


def test_partition_num_clients_and_samples_are_checked():
    labels = np.arange(10) % 3
    with pytest.raises(ConfigError, match=r"num_clients: must be an integer in \[1, 10\]"):
        iid(labels, 11, 0)
    with pytest.raises(ConfigError, match=r"num_clients: must be an integer in \[1, 10\]"):
        iid(labels, 0, 0)
    assert [len(s) for s in iid(labels, 10, 0).client_indices] == [1] * 10  # one each: allowed
    with pytest.raises(ConfigError, match="no samples to partition"):
        iid(np.array([], dtype=int), 1, 0)


def test_dirichlet_min_size_holds_or_stops_in_one_line():
    labels = np.repeat(np.arange(10), 100)
    part = dirichlet_classwise(labels, 10, 0, beta=0.5, min_size=40)
    assert min(len(s) for s in part.client_indices) >= 40
    assert sorted(np.concatenate(part.client_indices).tolist()) == list(range(1000))
    with pytest.raises(ConfigError, match=r"min_size: must be less than or equal to 100 "):
        dirichlet_classwise(labels, 10, 0, beta=0.5, min_size=101)  # more than n / N
    with pytest.raises(ConfigError, match="min_size: no draw gave all 10 clients >= 99"):
        dirichlet_classwise(labels, 10, 0, beta=0.1, min_size=99)
