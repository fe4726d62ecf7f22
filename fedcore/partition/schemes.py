"""The partition schemes, each wrapped by ``fedcore.partition.core.scheme`` with the
options its keyword-only parameters declare (``registry.PARTITIONERS`` names them); see the package's docstring for what each
one draws."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from annotated_types import Ge, Gt

from fedcore.errors import ConfigError
from fedcore.options import Float, Int
from fedcore.partition.core import (
    MAX_TRIES,
    Partition,
    SizeKind,
    as_labels,
    check,
    check_min_size,
    client_sizes,
    finish,
    scheme,
    setup,
)


@scheme
def iid(labels: np.ndarray, num_clients: int, seed: int) -> Partition:
    """Homogeneous split (seed 004 §6.1.3 "random uniform allocation"; NIID-Bench
    ``homo``): shuffle all indices, then ``np.array_split`` into equal parts."""
    labels, num_clients, seed, rng = setup("iid", labels, num_clients, seed)
    parts = np.array_split(rng.permutation(len(labels)), num_clients)
    return finish("iid", {"num_clients": num_clients, "seed": seed}, parts)


@scheme
def dirichlet_classwise(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    *,
    beta: Annotated[Float, Gt(0)] = 0.5,
    min_size: Annotated[Int, Ge(0)] = 10,
) -> Partition:
    """Class-wise Dirichlet, NIID-Bench ``noniid-labeldir`` (seed 000 §IV "p_k ~ Dir_N(beta),
    allocate p_k,j of class k to client j"; seed 004 §6.1.3 LDA): for each class k draw
    p_k ~ Dir_N(beta), drop clients already at >= n/N samples, renormalise, and cut class k's
    shuffled indices at the cumulative proportions. The whole draw is repeated until every
    client holds >= ``min_size`` samples (NIID-Bench's ``min_require_size``, 10)."""
    scheme = "dirichlet_classwise"
    labels, num_clients, seed, rng = setup(scheme, labels, num_clients, seed)
    n = len(labels)
    check_min_size(f"partition.{scheme}", min_size, n, num_clients)
    by_class = [np.flatnonzero(labels == k) for k in np.unique(labels)]
    for _ in range(MAX_TRIES):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx_k = rng.permutation(idx)
            is_open = np.array([len(c) < n / num_clients for c in parts])  # NIID-Bench balancing
            p = rng.dirichlet(np.full(num_clients, beta)) * is_open
            while not p.sum() > 0:  # tiny beta: all mass underflowed onto closed clients, where
                p = rng.dirichlet(np.full(num_clients, beta)) * is_open  # NIID-Bench gets NaN
            cum = np.cumsum(p / p.sum())
            # From the last open client on, the cumulative share is exactly 1: rounding
            # (0.9999999 x len) would hand a closed client after it one sample.
            cum[np.flatnonzero(p)[-1] :] = 1.0
            cuts = (cum * len(idx_k)).astype(np.int64)[:-1]
            for c, chunk in enumerate(np.split(idx_k, cuts)):
                parts[c].extend(chunk.tolist())
        if min(len(c) for c in parts) >= min_size:
            params = {"num_clients": num_clients, "seed": seed, "beta": beta, "min_size": min_size}
            return finish(scheme, params, [np.array(c, dtype=np.int64) for c in parts])
    raise ConfigError(
        f"partition.{scheme}.min_size: no draw gave all {num_clients} clients >= {min_size} "
        f"samples in {MAX_TRIES} tries; lower min_size or raise beta (got beta={beta:g})"
    )


@scheme
def dirichlet_clientwise(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    *,
    alpha: Annotated[Float, Gt(0)] = 1.0,
    sizes: SizeKind = "equal",
    size_rel_std: Annotated[Float, Ge(0)] = 0.3,
    size_beta: Annotated[Float, Gt(0)] = 1.0,
) -> Partition:
    """Client-wise Dirichlet (Hsu et al. 2019; seed 002 §4 "for each client we draw a class
    distribution q ~ Dir(p alpha)", p the global class prior).

    Sizes come first (``sizes``: ``equal``, ``normal`` with ``size_rel_std``, ``dirichlet``
    with ``size_beta``; :func:`client_sizes`). Then, in a random client order, client i draws
    q_i ~ Dir(alpha p) and fills its quota from the class pools without replacement: a
    multinomial(q_i) split, with what an exhausted pool cannot supply redrawn from q_i
    renormalised over the classes left (all of q_i's classes gone: in proportion to what is
    left). Unlike class-wise, sizes are exactly as drawn; the price is that the last clients'
    mixes lean towards the classes the others left over.
    """
    scheme = "dirichlet_clientwise"
    labels, num_clients, seed, rng = setup(scheme, labels, num_clients, seed)
    spread = size_beta if sizes == "dirichlet" else size_rel_std
    quota = client_sizes(len(labels), num_clients, rng, sizes, spread, 1, f"partition.{scheme}")
    classes, counts = np.unique(labels, return_counts=True)
    pools = [rng.permutation(np.flatnonzero(labels == k)) for k in classes]
    left = counts.astype(np.int64)  # pools[k][len - left[k]:] are still free
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in rng.permutation(num_clients):
        q = rng.dirichlet(alpha * counts / counts.sum())
        need = int(quota[c])
        while need > 0:
            w = q * (left > 0)
            if not w.sum() > 0:  # the classes this client favours are gone
                w = left.astype(np.float64)
            take = np.minimum(rng.multinomial(need, w / w.sum()), left)
            for k in np.flatnonzero(take):
                start = len(pools[k]) - int(left[k])
                parts[c].append(pools[k][start : start + int(take[k])])
            left -= take
            need -= int(take.sum())
    opts = {"alpha": alpha, "sizes": sizes, "size_rel_std": size_rel_std, "size_beta": size_beta}
    params = {"num_clients": num_clients, "seed": seed, **opts}
    return finish(scheme, params, [np.concatenate(p) for p in parts])


@scheme
def labels_per_client(
    labels: np.ndarray, num_clients: int, seed: int, *, m: Annotated[Int, Ge(1)] = 2
) -> Partition:
    """NIID-Bench ``noniid-#label{m}`` (seed 000 §IV, "#M" classes per client): client i holds
    class i mod C plus m-1 distinct other classes drawn at random; each class is split evenly
    (``np.array_split``) over the clients that hold it. A class held by nobody (possible when
    N*m < C) is dropped and listed in ``params["dropped_classes"]``; NIID-Bench would crash."""
    scheme = "labels_per_client"
    labels, num_clients, seed, rng = setup(scheme, labels, num_clients, seed)
    classes, counts = np.unique(labels, return_counts=True)
    C = len(classes)
    check(
        m <= C,
        f"partition.{scheme}.m: must be less than or equal to {C}, the number of classes (got {m})",
    )
    held = []  # client i: class i mod C plus m-1 distinct others
    for i in range(num_clients):
        held.append({i % C, *rng.permutation(np.delete(np.arange(C), i % C))[: m - 1].tolist()})
    holders = [[i for i in range(num_clients) if k in held[i]] for k in range(C)]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(C):
        check(  # an empty share would leave a client with fewer than m labels
            counts[k] >= len(holders[k]),
            f"partition.{scheme}.m: class {classes[k]} has {counts[k]} samples for "
            f"{len(holders[k])} clients holding it; lower m or num_clients (got m={m})",
        )
        if holders[k]:
            idx_k = rng.permutation(np.flatnonzero(labels == classes[k]))
            for i, chunk in zip(holders[k], np.array_split(idx_k, len(holders[k])), strict=True):
                parts[i].append(chunk)
    dropped = [int(classes[k]) for k in range(C) if not holders[k]]
    params = {"num_clients": num_clients, "seed": seed, "m": m, "dropped_classes": dropped}
    return finish(scheme, params, [np.concatenate(p) for p in parts])


@scheme
def gaussian_noise(
    labels: np.ndarray, num_clients: int, seed: int, *, sigma: Annotated[Float, Ge(0)] = 0.1
) -> Partition:
    """Noise-based feature skew (seed 000 §IV; NIID-Bench ``noise``): the ``iid`` split for
    the same seed, and client C_i, i = 1..N, gets x^ ~ Gau(sigma * i / N), "mean 0 and
    variance sigma * i / N": the clients are C_1..C_N, so shard k (0-based) is C_{k+1} with
    ``noise_var[k] = sigma * (k + 1) / N`` (a variance, not a std; the last client gets sigma,
    none is noise-free)."""
    base = iid(labels, num_clients, seed)
    n = base.num_clients
    noise = tuple(sigma * (k + 1) / n for k in range(n))
    return Partition("gaussian_noise", {**base.params, "sigma": sigma}, base.client_indices, noise)


def _quantity(
    scheme: str, labels: Any, num_clients: Any, seed: Any, option: str, value: float, min_size: int
) -> Partition:
    """Quantity skew: sizes from :func:`client_sizes`, labels iid within each client."""
    labels, num_clients, seed, rng = setup(scheme, labels, num_clients, seed)
    kind, key = ("dirichlet" if option == "beta" else "normal"), f"partition.{scheme}"
    sizes = client_sizes(len(labels), num_clients, rng, kind, value, min_size, key)
    parts = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    params = {"num_clients": num_clients, "seed": seed, option: value, "min_size": min_size}
    return finish(scheme, params, parts)


@scheme
def quantity_normal(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    *,
    rel_std: Annotated[Float, Ge(0)] = 0.3,
    min_size: Annotated[Int, Ge(1)] = 1,
) -> Partition:
    """Seed 002 §4 quantity skew: sizes ~ Normal(n/N, rel_std * n/N), clipped at ``min_size``,
    rescaled to sum to n (largest remainder); labels iid within each client."""
    return _quantity("quantity_normal", labels, num_clients, seed, "rel_std", rel_std, min_size)


@scheme
def quantity_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    *,
    beta: Annotated[Float, Gt(0)] = 0.5,
    min_size: Annotated[Int, Ge(1)] = 1,
) -> Partition:
    """NIID-Bench ``iid-diff-quantity``: sizes proportional to Dir_N(beta), redrawn until every
    client has >= ``min_size``; labels iid within each client."""
    return _quantity("quantity_dirichlet", labels, num_clients, seed, "beta", beta, min_size)


@scheme
def natural(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    groups: np.ndarray | None = None,
    *,
    min_samples: Annotated[Int, Ge(1)] = 10,
) -> Partition:
    """The data's own clients: one client per group of samples (Shakespeare: one speaking
    role of a play, as LEAF and TFF federate it; seed 003 §4's federated Shakespeare). The
    groups holding at least ``min_samples`` samples are eligible; ``num_clients`` of them are
    drawn without replacement from the seed (all of them when ``num_clients`` is their
    number), and client c holds the c-th drawn group in group order, all its samples. The
    drawn group ids are recorded in ``params["groups"]``; samples of undrawn groups are unused."""
    scheme = "natural"
    labels, num_clients, seed, rng = setup(scheme, labels, num_clients, seed)
    check(
        groups is not None,
        f"partition.{scheme}: the dataset has no natural clients (groups of samples); use a "
        "dataset that has them (shakespeare: its speaking roles) or another scheme",
    )
    groups = as_labels(groups)
    check(
        len(groups) == len(labels),
        f"partition.{scheme}: {len(groups)} groups for {len(labels)} samples",
    )
    ids, counts = np.unique(groups, return_counts=True)
    eligible = ids[counts >= min_samples]
    check(
        num_clients <= len(eligible),
        f"partition.num_clients: {num_clients} clients but only {len(eligible)} groups (roles) "
        f"hold >= {min_samples} samples (partition.{scheme}.min_samples); use at most "
        f"{len(eligible)} clients or lower min_samples",
    )
    chosen = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    order = np.argsort(groups, kind="stable")  # samples by group, then by index
    bounds = np.searchsorted(groups[order], np.stack([chosen, chosen + 1]))
    parts = [order[a:b] for a, b in bounds.T]
    params = {
        "num_clients": num_clients,
        "seed": seed,
        "min_samples": min_samples,
        "groups": chosen.tolist(),
    }
    return finish(scheme, params, parts)
