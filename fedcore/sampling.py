"""Seeded random choices of the server: which clients train, on which of their samples.

Every draw comes from ``derive_seed(seed, stream, round, ...)``, so a run's choices depend
only on the experiment seed, never on worker count or completion order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

SAMPLING_STREAM = 1  # which clients a round selects
CLIENT_STREAM = 2  # a client's local batch order (and feature noise)
VIRTUAL_CLIENT_STREAM = 3  # FedVC's per-round sample draw


class SamplingConfig(Protocol):
    """The selection settings of engine.FederationConfig (read-only)."""

    @property
    def clients_per_round(self) -> int: ...

    @property
    def sampling(self) -> str: ...

    @property
    def seed(self) -> int: ...


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of integers (NumPy SeedSequence: independent streams)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(2, dtype=np.uint64)[0] >> 1)


def sample_clients(cfg: SamplingConfig, num_clients: int, round_: int) -> tuple[int, ...]:
    """Uniform selection: distinct clients (sorted), or independent draws with replacement."""
    rng = np.random.default_rng(derive_seed(cfg.seed, SAMPLING_STREAM, round_))
    m = cfg.clients_per_round
    if cfg.sampling == "with_replacement":
        picked = rng.integers(0, num_clients, size=m)
    elif m >= num_clients:
        picked = np.arange(num_clients)
    else:
        picked = np.sort(rng.choice(num_clients, size=m, replace=False))
    return tuple(int(c) for c in picked)


def sample_clients_by_size(
    cfg: SamplingConfig, sizes: Sequence[int], round_: int
) -> tuple[int, ...]:
    """Selection with probability proportional to n_k (seed 002 §3.1, FedVC).

    With replacement each draw is exactly proportional to n_k; without replacement the draws
    are successive (NumPy's weighted sampling), so the first pick is proportional to n_k.
    """
    rng = np.random.default_rng(derive_seed(cfg.seed, SAMPLING_STREAM, round_))
    n = np.asarray(sizes, dtype=np.float64)
    p = n / n.sum()
    m = cfg.clients_per_round
    if cfg.sampling == "with_replacement":
        picked = rng.choice(len(n), size=m, replace=True, p=p)
    elif m >= int((n > 0).sum()):
        picked = np.flatnonzero(n > 0)
    else:
        picked = np.sort(rng.choice(len(n), size=m, replace=False, p=p))
    return tuple(int(c) for c in picked)
