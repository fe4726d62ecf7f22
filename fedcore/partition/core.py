"""The :class:`Partition` type, the checks every scheme shares, and client sizes.

A refusal is a one-line ``ConfigError`` naming the key (``partition.<scheme>.<option>``) and
the bound it breaks.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, get_args

import numpy as np
from numpy.random import Generator

from fedcore.errors import ConfigError
from fedcore.options import dump, parse, signature_options

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
        labels = as_labels(labels)
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


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _integer(key: str, value: Any, low: int, high: int | None = None) -> int:
    """``num_clients`` or ``seed`` (not options: every scheme has them) in [low, high]."""
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    ok = ok and low <= value and (high is None or value <= high)
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    check(ok, f"{key}: must be an integer {bound} (got {value!r})")
    return int(value)


def check_min_size(key: str, min_size: int, n: int, num_clients: int) -> None:
    """The data-dependent bound on a ``min_size`` option (its type says only >= 0 or >= 1)."""
    high = n // num_clients
    check(
        min_size <= high,
        f"{key}.min_size: must be less than or equal to {high} = {n} samples // "
        f"{num_clients} clients (got {min_size})",
    )


def as_labels(labels: Any) -> np.ndarray:
    arr = np.asarray(labels)
    ok = arr.ndim == 1 and (arr.size == 0 or np.issubdtype(arr.dtype, np.integer))
    check(
        ok and (arr.size == 0 or arr.min() >= 0),
        f"partition labels must be a 1-D array of integers >= 0 (got {arr.dtype}, shape {arr.shape})",
    )
    return arr.astype(np.int64, copy=False)


def setup(
    scheme: str, labels: Any, num_clients: Any, seed: Any
) -> tuple[np.ndarray, int, int, Generator]:
    """Checks shared by every scheme; returns labels, num_clients, seed and the scheme's RNG."""
    labels = as_labels(labels)
    n = len(labels)
    num_clients = _integer("partition.num_clients", num_clients, 1, max(n, 1))
    check(n > 0, f"partition.{scheme}: no samples to partition")
    seed = _integer("partition.seed", seed, 0)
    return labels, num_clients, seed, np.random.default_rng(seed)


def finish(scheme: str, params: dict[str, Any], parts: list[np.ndarray]) -> Partition:
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
    check_min_size(key, min_size, n, num_clients)
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


_NOT_OPTIONS = ("labels", "num_clients", "seed", "groups")
_F = TypeVar("_F", bound=Callable[..., Partition])


def scheme(fn: _F) -> _F:
    """``fn`` wrapped so that its keyword options pass :func:`fedcore.options.parse` against
    its options dataclass, derived here from ``fn``'s signature and annotations (``wraps``
    keeps both visible) and set as ``<scheme>.Options`` on the wrapper, where pickle finds
    it. Nothing is registered: ``registry.PARTITIONERS`` names the scheme."""
    name = fn.__name__
    takes_groups = "groups" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def wrapped(
        labels: Any, num_clients: Any, seed: Any, groups: Any = None, **options: Any
    ) -> Partition:
        valid = parse(wrapped.Options, options, f"partition.{name}")  # type: ignore[attr-defined]
        extra = {"groups": groups} if takes_groups else {}  # the others split by labels
        return fn(labels, num_clients, seed, **extra, **dump(valid))

    signature_options(wrapped, f"{name}_options", skip=_NOT_OPTIONS)  # wrapped.Options
    return cast(_F, wrapped)
