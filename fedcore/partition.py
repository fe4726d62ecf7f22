"""Seeded, pure partitioners: labels -> one sorted index array per client.

Two Dirichlet schemes are named apart because they are different experiments:

* ``dirichlet_classwise`` -- each *class* is split over the clients with p_k ~ Dir_N(beta)
  (NIID-Bench ``noniid-labeldir``, the seeds' Dir(beta) / LDA: seed 000 §IV, seed 004 §6.1.3).
  Client sizes come out unequal.
* ``dirichlet_clientwise`` -- each *client* draws its own class mix q_i ~ Dir(alpha p)
  (Hsu et al. 2019, seed 002 §4), with client sizes set separately (equal by default).

Every function takes ``seed`` and uses only its own ``numpy.random.Generator``; the same
arguments give byte-identical manifests.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import io
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.errors import ConfigError, UnknownNameError


@dataclass(frozen=True)
class Partition:
    scheme: str
    params: dict[str, Any]
    client_indices: tuple[np.ndarray, ...]  # int64, sorted, per client
    noise_var: tuple[float, ...]  # Gaussian feature-noise variance per client (0: none)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    def label_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        return np.stack(
            [np.bincount(labels[ix], minlength=num_classes) for ix in self.client_indices]
        ).astype(np.int64)

    def content_hash(self) -> str:
        h = hashlib.sha256()
        h.update(
            json.dumps({"scheme": self.scheme, "params": self.params}, sort_keys=True).encode()
        )
        for ix, var in zip(self.client_indices, self.noise_var, strict=True):
            h.update(np.int64(len(ix)).tobytes())
            h.update(np.ascontiguousarray(ix, dtype="<i8").tobytes())
            h.update(repr(float(var)).encode())
        return h.hexdigest()


# ---- helpers ---------------------------------------------------------------------------------


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _finish(
    scheme: str, params: dict[str, Any], parts: list[np.ndarray], noise: list[float] | None = None
) -> Partition:
    ix = tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts)
    return Partition(scheme, params, ix, tuple(noise or [0.0] * len(ix)))


def _split_by_sizes(order: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(order, np.cumsum(sizes)[:-1])


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integer sizes proportional to ``shares`` summing exactly to ``total``."""
    raw = shares / shares.sum() * total
    sizes = np.floor(raw).astype(np.int64)
    rest = total - int(sizes.sum())
    if rest:
        sizes[np.argsort(-(raw - sizes), kind="stable")[:rest]] += 1
    return sizes


def client_sizes(
    n: int,
    num_clients: int,
    rng: np.random.Generator,
    *,
    kind: str = "equal",
    rel_std: float = 0.0,
    beta: float = 1.0,
    min_size: int = 1,
    max_tries: int = 1000,
) -> np.ndarray:
    """Client sizes summing to n: equal, Normal(n/N, rel_std n/N) (seed 002 §4), or Dir(beta)."""
    _check(
        min_size * num_clients <= n,
        f"partition.min_size: {num_clients} clients x {min_size} exceeds {n} samples",
    )
    if kind == "equal":
        return _largest_remainder(np.ones(num_clients), n)
    for _ in range(max_tries):
        if kind == "normal":
            mean = n / num_clients
            shares = np.clip(rng.normal(mean, rel_std * mean, size=num_clients), min_size, None)
        elif kind == "dirichlet":
            shares = rng.dirichlet(np.full(num_clients, beta))
        else:
            raise ConfigError(
                f"partition sizes must be one of equal, normal, dirichlet (got {kind!r})"
            )
        sizes = _largest_remainder(shares, n)
        if sizes.min() >= min_size:
            return sizes
    raise ConfigError(
        f"partition: could not draw {num_clients} client sizes >= min_size={min_size}; lower min_size"
    )


# ---- schemes ---------------------------------------------------------------------------------


def iid(labels: np.ndarray, num_clients: int, seed: int) -> Partition:
    """Shuffle, then ``np.array_split`` (seed 004 §6.1.3, homogeneous)."""
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(labels)), num_clients)
    return _finish("iid", {"num_clients": num_clients, "seed": seed}, parts)


def dirichlet_classwise(
    labels: np.ndarray, num_clients: int, seed: int, beta: float = 0.5, min_size: int = 10
) -> Partition:
    """NIID-Bench ``noniid-labeldir``: p_k ~ Dir_N(beta) per class k; redraw until every
    client has >= min_size samples. Clients already holding >= n/N samples get no more of
    the current class (NIID-Bench's balancing step)."""
    _check(beta > 0, f"partition.dirichlet_classwise.beta must be > 0 (got {beta})")
    _check(min_size >= 0, f"partition.dirichlet_classwise.min_size must be >= 0 (got {min_size})")
    _check(
        min_size * num_clients <= len(labels),
        f"partition.dirichlet_classwise.min_size: {num_clients} clients x {min_size} exceeds {len(labels)} samples",
    )
    rng = np.random.default_rng(seed)
    n, classes = len(labels), np.unique(labels)
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for k in classes:
            idx_k = np.flatnonzero(labels == k)
            rng.shuffle(idx_k)
            p = rng.dirichlet(np.full(num_clients, beta))
            p = p * np.array([len(c) < n / num_clients for c in parts])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for c, chunk in enumerate(np.split(idx_k, cuts)):
                parts[c].extend(chunk.tolist())
        if min(len(c) for c in parts) >= min_size:
            params = {"num_clients": num_clients, "seed": seed, "beta": beta, "min_size": min_size}
            return _finish("dirichlet_classwise", params, [np.array(c) for c in parts])
    raise ConfigError(
        f"partition.dirichlet_classwise: no draw gave every client >= {min_size} samples in 1000 tries; lower min_size or raise beta"
    )


def dirichlet_clientwise(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    alpha: float = 1.0,
    sizes: str = "equal",
    size_rel_std: float = 0.0,
    size_beta: float = 1.0,
) -> Partition:
    """Hsu et al. / seed 002 §4: client i draws q_i ~ Dir(alpha p), p the global class prior,
    then takes its samples class by class without replacement; a class that runs out is
    removed from q_i (renormalised) for the remaining draws."""
    _check(alpha > 0, f"partition.dirichlet_clientwise.alpha must be > 0 (got {alpha})")
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    prior = counts / counts.sum()
    pools = [rng.permutation(np.flatnonzero(labels == k)).tolist() for k in classes]
    quota = client_sizes(
        len(labels), num_clients, rng, kind=sizes, rel_std=size_rel_std, beta=size_beta
    )
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in range(num_clients):
        q = rng.dirichlet(alpha * prior)
        need = int(quota[c])
        while need > 0:
            avail = np.array([len(p) > 0 for p in pools])
            w = q * avail
            if w.sum() <= 0:  # every class this client wants is exhausted: use what is left
                w = avail.astype(float)
            draws = np.bincount(
                rng.choice(len(classes), size=need, p=w / w.sum()), minlength=len(classes)
            )
            for k in np.flatnonzero(draws):
                take = min(int(draws[k]), len(pools[k]))
                parts[c].extend(pools[k][:take])
                del pools[k][:take]
                need -= take
    params = {
        "num_clients": num_clients,
        "seed": seed,
        "alpha": alpha,
        "sizes": sizes,
        "size_rel_std": size_rel_std,
        "size_beta": size_beta,
    }
    return _finish("dirichlet_clientwise", params, [np.array(p) for p in parts])


def labels_per_client(labels: np.ndarray, num_clients: int, seed: int, m: int = 2) -> Partition:
    """NIID-Bench ``noniid-#label{m}`` (seed 000 §IV, #M): client i holds class i mod C plus
    m-1 other distinct random classes; each class is split evenly over its holders. Classes
    nobody holds are dropped (listed in params)."""
    classes = np.unique(labels)
    C = len(classes)
    _check(1 <= m <= C, f"partition.labels_per_client.m must be in [1, {C}] (got {m})")
    rng = np.random.default_rng(seed)
    held: list[list[int]] = []
    for i in range(num_clients):
        first = i % C
        others = rng.permutation([k for k in range(C) if k != first])[: m - 1]
        held.append([first, *others.tolist()])
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    dropped = []
    for k in range(C):
        holders = [i for i in range(num_clients) if k in held[i]]
        if not holders:
            dropped.append(int(classes[k]))
            continue
        idx_k = rng.permutation(np.flatnonzero(labels == classes[k]))
        for i, chunk in zip(holders, np.array_split(idx_k, len(holders)), strict=True):
            parts[i].extend(chunk.tolist())
    params = {"num_clients": num_clients, "seed": seed, "m": m, "dropped_classes": dropped}
    return _finish("labels_per_client", params, [np.array(p) for p in parts])


def gaussian_noise(
    labels: np.ndarray, num_clients: int, seed: int, sigma: float = 0.1
) -> Partition:
    """Seed 000 §IV feature skew: an iid split; client i (0-based) of N sees its inputs plus
    noise of variance sigma * i / N, Gau(sigma * i / N)."""
    _check(sigma >= 0, f"partition.gaussian_noise.sigma must be >= 0 (got {sigma})")
    base = iid(labels, num_clients, seed)
    noise = [sigma * i / num_clients for i in range(num_clients)]
    params = {"num_clients": num_clients, "seed": seed, "sigma": sigma}
    return Partition("gaussian_noise", params, base.client_indices, tuple(noise))


def quantity_normal(
    labels: np.ndarray, num_clients: int, seed: int, rel_std: float = 0.3, min_size: int = 1
) -> Partition:
    """Seed 002 §4: client sizes ~ Normal(n/N, rel_std * n/N), labels iid within."""
    _check(rel_std >= 0, f"partition.quantity_normal.rel_std must be >= 0 (got {rel_std})")
    rng = np.random.default_rng(seed)
    sizes = client_sizes(
        len(labels), num_clients, rng, kind="normal", rel_std=rel_std, min_size=min_size
    )
    parts = _split_by_sizes(rng.permutation(len(labels)), sizes)
    params = {"num_clients": num_clients, "seed": seed, "rel_std": rel_std, "min_size": min_size}
    return _finish("quantity_normal", params, parts)


def quantity_dirichlet(
    labels: np.ndarray, num_clients: int, seed: int, beta: float = 0.5, min_size: int = 1
) -> Partition:
    """NIID-Bench ``iid-diff-quantity``: client sizes proportional to Dir(beta)."""
    _check(beta > 0, f"partition.quantity_dirichlet.beta must be > 0 (got {beta})")
    rng = np.random.default_rng(seed)
    sizes = client_sizes(
        len(labels), num_clients, rng, kind="dirichlet", beta=beta, min_size=min_size
    )
    parts = _split_by_sizes(rng.permutation(len(labels)), sizes)
    params = {"num_clients": num_clients, "seed": seed, "beta": beta, "min_size": min_size}
    return _finish("quantity_dirichlet", params, parts)


PARTITIONERS: dict[str, Callable[..., Partition]] = {
    f.__name__: f
    for f in (
        iid,
        dirichlet_classwise,
        dirichlet_clientwise,
        labels_per_client,
        gaussian_noise,
        quantity_normal,
        quantity_dirichlet,
    )
}


def list_partitioners() -> list[str]:
    return sorted(PARTITIONERS)


def scheme_options(scheme: str) -> list[str]:
    if scheme not in PARTITIONERS:
        raise UnknownNameError("partition scheme", scheme, PARTITIONERS)
    skip = {"labels", "num_clients", "seed"}
    return [p for p in inspect.signature(PARTITIONERS[scheme]).parameters if p not in skip]


def make_partition(
    scheme: str, labels: np.ndarray, *, num_clients: int, seed: int, **options: Any
) -> Partition:
    allowed = scheme_options(scheme)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"partition.{scheme}.{unknown[0]} is not an option of {scheme}; allowed: {', '.join(allowed) or 'none'}"
        )
    labels = np.asarray(labels)
    _check(num_clients >= 1, f"partition.num_clients must be >= 1 (got {num_clients})")
    _check(
        num_clients <= len(labels),
        f"partition.num_clients: {num_clients} clients but only {len(labels)} samples",
    )
    return PARTITIONERS[scheme](labels, num_clients, seed, **options)


# ---- manifest and statistics ---------------------------------------------------------------


def _atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(partition: Partition, labels: np.ndarray, path: str | Path) -> None:
    """CSV ``client_id,sample_index,label`` sorted by (client, sample); written atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["client_id", "sample_index", "label"])
    for c, ix in enumerate(partition.client_indices):
        w.writerows(zip([c] * len(ix), ix.tolist(), np.asarray(labels)[ix].tolist(), strict=True))
    _atomic_write_text(path, buf.getvalue())


def read_manifest(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    return data[:, 0], data[:, 1], data[:, 2]


def partition_stats(partition: Partition, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    counts = partition.label_counts(np.asarray(labels), num_classes)
    sizes = counts.sum(axis=1)
    return {
        "scheme": partition.scheme,
        "params": partition.params,
        "content_hash": partition.content_hash(),
        "num_clients": partition.num_clients,
        "num_classes": num_classes,
        "total_samples": int(sizes.sum()),
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
    _atomic_write_text(path, json.dumps(stats, indent=2, sort_keys=True) + "\n")
