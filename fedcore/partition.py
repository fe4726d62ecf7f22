"""Seeded, pure partitioners: labels -> one sorted int64 index array per client.

Each scheme draws only from ``numpy.random.default_rng(seed)``: the same labels, num_clients,
seed and options give the same content hash and byte-identical manifests.

The two Dirichlet schemes are different experiments and are named apart:

* ``dirichlet_classwise`` splits each *class* over the clients: p_k ~ Dir_N(beta) is the
  share of class k that each of the N clients gets (NIID-Bench ``noniid-labeldir``, Li et al.
  2021; the seeds' Dir(beta), seed 000 §IV, and FedML's LDA Dir(0.3), seed 004 §6.1.3).
  Client sizes are an outcome, not a parameter: small beta gives very unequal clients.
* ``dirichlet_clientwise`` lets each *client* draw its class mix q_i ~ Dir(alpha p), p the
  global class prior (Hsu et al. 2019, seed 002 §4), and sets client sizes separately (equal,
  normal or Dirichlet). Shares within a class are not controlled: a popular class is shared
  by whichever clients want it, while a client's size is fixed in advance.

Feature skew (``gaussian_noise``, seed 000 §IV) is a per-client noise variance, applied by
``fedcore.client``.

A dataset with natural clients (Shakespeare's speaking roles) gives each sample a ``group``;
``natural`` puts each group on a client of its own (the other schemes ignore groups).

A scheme's options are its keyword-only parameters, their annotations the allowed values
(``beta: Annotated[Float, Gt(0)] = 0.5``); ``_register`` derives ``<scheme>.Options`` from them
and wraps the scheme so that options, given directly or through :func:`make_partition`, pass
:func:`fedcore.options.parse`. Only data-dependent bounds (``min_size <= n // num_clients``,
``m <=`` the number of classes) are checked in the scheme.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, cast, get_args

import numpy as np
from annotated_types import Ge, Gt
from numpy.random import Generator

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.options import Float, Int, dump, option_names, parse, signature_options

MANIFEST_HEADER = "client_id,sample_index,label"
MAX_TRIES = 1000  # redraws allowed for a min_size constraint before giving up
SizeKind = Literal["equal", "normal", "dirichlet"]
SIZE_KINDS: tuple[str, ...] = get_args(SizeKind)


@dataclass(frozen=True, eq=False)  # arrays make == ambiguous: compare content_hash()
class Partition:
    scheme: str
    params: dict[str, Any]  # the scheme's parameters incl. num_clients and seed (JSON-ready)
    client_indices: tuple[np.ndarray, ...]  # int64 sample indices per client, sorted
    noise_var: tuple[float, ...]  # Gaussian feature-noise variance per client (0.0: none)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    def label_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """(num_clients, num_classes) int64 counts of each label on each client."""
        labels = _as_labels(labels)
        rows = [np.bincount(labels[ix], minlength=num_classes) for ix in self.client_indices]
        return np.stack(rows).astype(np.int64).reshape(self.num_clients, num_classes)

    def content_hash(self) -> str:
        """sha256 over: JSON {"params", "scheme"} (sorted keys), then per client its length
        and indices as little-endian int64 and ``repr`` of its noise variance."""
        h = hashlib.sha256()
        h.update(
            json.dumps({"scheme": self.scheme, "params": self.params}, sort_keys=True).encode()
        )
        for ix, var in zip(self.client_indices, self.noise_var, strict=True):
            h.update(np.array(len(ix), dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(ix, dtype="<i8").tobytes())
            h.update(repr(float(var)).encode())
        return h.hexdigest()


# ---- validation ------------------------------------------------------------------------------


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _integer(key: str, value: Any, low: int, high: int | None = None) -> int:
    """``num_clients`` or ``seed`` (not options: every scheme has them) in [low, high]."""
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    ok = ok and low <= value and (high is None or value <= high)
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    _check(ok, f"{key}: must be an integer {bound} (got {value!r})")
    return int(value)


def _check_min_size(key: str, min_size: int, n: int, num_clients: int) -> None:
    """The data-dependent bound on a ``min_size`` option (its type says only >= 0 or >= 1)."""
    high = n // num_clients
    _check(
        min_size <= high,
        f"{key}.min_size: must be less than or equal to {high} = {n} samples // "
        f"{num_clients} clients (got {min_size})",
    )


def _as_labels(labels: Any) -> np.ndarray:
    arr = np.asarray(labels)
    ok = arr.ndim == 1 and (arr.size == 0 or np.issubdtype(arr.dtype, np.integer))
    _check(
        ok and (arr.size == 0 or arr.min() >= 0),
        f"partition labels must be a 1-D array of integers >= 0 (got {arr.dtype}, shape {arr.shape})",
    )
    return arr.astype(np.int64, copy=False)


def _setup(
    scheme: str, labels: Any, num_clients: Any, seed: Any
) -> tuple[np.ndarray, int, int, Generator]:
    """Checks shared by every scheme; returns labels, num_clients, seed and the scheme's RNG."""
    labels = _as_labels(labels)
    n = len(labels)
    num_clients = _integer("partition.num_clients", num_clients, 1, max(n, 1))
    _check(n > 0, f"partition.{scheme}: no samples to partition")
    seed = _integer("partition.seed", seed, 0)
    return labels, num_clients, seed, np.random.default_rng(seed)


def _finish(scheme: str, params: dict[str, Any], parts: list[np.ndarray]) -> Partition:
    ix = tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts)
    return Partition(scheme, params, ix, (0.0,) * len(ix))


# ---- client sizes (shared by the client-wise and quantity-skew schemes) ----------------------


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integer sizes proportional to ``shares`` summing exactly to ``total`` (Hamilton's method;
    ties go to the lower client id)."""
    raw = shares / shares.sum() * total
    sizes = np.floor(raw).astype(np.int64)
    sizes[np.argsort(-(raw - sizes), kind="stable")[: total - int(sizes.sum())]] += 1
    return sizes


def client_sizes(
    n: int, num_clients: int, rng: Generator, kind: str, spread: float, min_size: int, key: str
) -> np.ndarray:
    """``num_clients`` int64 sizes, each >= ``min_size``, summing exactly to ``n``.

    ``equal``: n/N each, remainder to the first clients (as ``np.array_split``). ``normal``
    (seed 002 §4, "drawn from a normal distribution controlled with a relative standard
    deviation"): x_i ~ Normal(n/N, spread n/N) clipped at ``min_size``, then the excess over
    ``min_size`` is rescaled to sum to n (rescaling the sizes themselves could push a clipped
    client back under it). ``dirichlet`` (NIID-Bench ``iid-diff-quantity``): shares ~
    Dir_N(spread), redrawn until every client has >= ``min_size``.
    """
    _check_min_size(key, min_size, n, num_clients)
    if kind == "equal":
        return _largest_remainder(np.ones(num_clients), n)
    if kind == "normal":
        mean = n / num_clients
        excess = np.clip(rng.normal(mean, spread * mean, num_clients), min_size, None) - min_size
        if not excess.sum() > 0:  # every draw clipped: nothing tells the clients apart
            excess = np.ones(num_clients)
        return min_size + _largest_remainder(excess, n - min_size * num_clients)
    for _ in range(MAX_TRIES):
        sizes = _largest_remainder(rng.dirichlet(np.full(num_clients, spread)), n)
        if sizes.min() >= min_size:
            return sizes
    raise ConfigError(
        f"{key}.min_size: no Dir({spread:g}) draw gave all {num_clients} clients >= {min_size} "
        f"samples in {MAX_TRIES} tries; lower min_size or raise the Dirichlet concentration"
    )


# ---- schemes -------------------------------------------------------------------------------

PARTITIONERS: dict[str, Callable[..., Partition]] = {}  # name -> the wrapped scheme
_OPTIONS: dict[str, type[Any]] = {}  # name -> its options dataclass
_NOT_OPTIONS = ("labels", "num_clients", "seed", "groups")
_F = TypeVar("_F", bound=Callable[..., Partition])


def _register(fn: _F) -> _F:
    """Register ``fn`` wrapped so that its keyword options pass :func:`parse` against its
    options dataclass, derived here from ``fn``'s signature and annotations (``wraps`` keeps
    both visible) and set as ``<scheme>.Options`` on the wrapper, where pickle finds it."""
    name = fn.__name__
    takes_groups = "groups" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def scheme(
        labels: Any, num_clients: Any, seed: Any, groups: Any = None, **options: Any
    ) -> Partition:
        valid = parse(_OPTIONS[name], options, f"partition.{name}")
        extra = {"groups": groups} if takes_groups else {}  # the others split by labels
        return fn(labels, num_clients, seed, **extra, **dump(valid))

    _OPTIONS[name] = signature_options(scheme, f"{name}_options", skip=_NOT_OPTIONS)
    PARTITIONERS[name] = scheme
    return cast(_F, scheme)


@_register
def iid(labels: np.ndarray, num_clients: int, seed: int) -> Partition:
    """Homogeneous split (seed 004 §6.1.3 "random uniform allocation"; NIID-Bench
    ``homo``): shuffle all indices, then ``np.array_split`` into equal parts."""
    labels, num_clients, seed, rng = _setup("iid", labels, num_clients, seed)
    parts = np.array_split(rng.permutation(len(labels)), num_clients)
    return _finish("iid", {"num_clients": num_clients, "seed": seed}, parts)


@_register
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
    labels, num_clients, seed, rng = _setup(scheme, labels, num_clients, seed)
    n = len(labels)
    _check_min_size(f"partition.{scheme}", min_size, n, num_clients)
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
            return _finish(scheme, params, [np.array(c, dtype=np.int64) for c in parts])
    raise ConfigError(
        f"partition.{scheme}.min_size: no draw gave all {num_clients} clients >= {min_size} "
        f"samples in {MAX_TRIES} tries; lower min_size or raise beta (got beta={beta:g})"
    )


@_register
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
    labels, num_clients, seed, rng = _setup(scheme, labels, num_clients, seed)
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
    return _finish(scheme, params, [np.concatenate(p) for p in parts])


@_register
def labels_per_client(
    labels: np.ndarray, num_clients: int, seed: int, *, m: Annotated[Int, Ge(1)] = 2
) -> Partition:
    """NIID-Bench ``noniid-#label{m}`` (seed 000 §IV, "#M" classes per client): client i holds
    class i mod C plus m-1 distinct other classes drawn at random; each class is split evenly
    (``np.array_split``) over the clients that hold it. A class held by nobody (possible when
    N*m < C) is dropped and listed in ``params["dropped_classes"]``; NIID-Bench would crash."""
    scheme = "labels_per_client"
    labels, num_clients, seed, rng = _setup(scheme, labels, num_clients, seed)
    classes, counts = np.unique(labels, return_counts=True)
    C = len(classes)
    _check(
        m <= C,
        f"partition.{scheme}.m: must be less than or equal to {C}, the number of classes (got {m})",
    )
    held = []  # client i: class i mod C plus m-1 distinct others
    for i in range(num_clients):
        held.append({i % C, *rng.permutation(np.delete(np.arange(C), i % C))[: m - 1].tolist()})
    holders = [[i for i in range(num_clients) if k in held[i]] for k in range(C)]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(C):
        _check(  # an empty share would leave a client with fewer than m labels
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
    return _finish(scheme, params, [np.concatenate(p) for p in parts])


@_register
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
    labels, num_clients, seed, rng = _setup(scheme, labels, num_clients, seed)
    kind, key = ("dirichlet" if option == "beta" else "normal"), f"partition.{scheme}"
    sizes = client_sizes(len(labels), num_clients, rng, kind, value, min_size, key)
    parts = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    params = {"num_clients": num_clients, "seed": seed, option: value, "min_size": min_size}
    return _finish(scheme, params, parts)


@_register
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


@_register
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


@_register
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
    labels, num_clients, seed, rng = _setup(scheme, labels, num_clients, seed)
    _check(
        groups is not None,
        f"partition.{scheme}: the dataset has no natural clients (groups of samples); use a "
        "dataset that has them (shakespeare: its speaking roles) or another scheme",
    )
    groups = _as_labels(groups)
    _check(
        len(groups) == len(labels),
        f"partition.{scheme}: {len(groups)} groups for {len(labels)} samples",
    )
    ids, counts = np.unique(groups, return_counts=True)
    eligible = ids[counts >= min_samples]
    _check(
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
    return _finish(scheme, params, parts)


def list_partitioners() -> list[str]:
    return sorted(PARTITIONERS)


def scheme_options_type(scheme: str) -> type[Any]:
    """The frozen options dataclass of ``scheme`` (``<scheme>.Options``; see ``_register``)."""
    if scheme not in PARTITIONERS:
        raise UnknownNameError("partition scheme", scheme, PARTITIONERS)
    return _OPTIONS[scheme]


def scheme_options(scheme: str) -> list[str]:
    """The option names ``scheme`` accepts besides labels, num_clients and seed."""
    return option_names(scheme_options_type(scheme))


def make_partition(
    scheme: str,
    labels: np.ndarray,
    *,
    num_clients: int,
    seed: int,
    options: Mapping[str, Any] | object | None = None,
    groups: np.ndarray | None = None,
    **kwargs: Any,
) -> Partition:
    """Partition ``labels`` with the registered ``scheme``. Its options: ``options`` (a typed
    ``scheme_options_type(scheme)`` instance, or a mapping) updated by keyword arguments; the
    rest take their defaults. The scheme's wrapper parses them all, a hand-built instance too.
    ``groups``: each sample's natural client (``natural`` needs them; the others ignore them)."""
    cls = scheme_options_type(scheme)
    if options is None or isinstance(options, Mapping):
        given = dict(options or {})
    else:  # an instance of cls; anything else (another scheme's options) is refused here
        given = dump(parse(cls, options, f"partition.{scheme}"))
    return PARTITIONERS[scheme](labels, num_clients, seed, groups, **{**given, **kwargs})
