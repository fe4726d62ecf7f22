"""Seeded random choices of the server: which clients train, on which of their samples.

Every draw comes from ``derive_seed(seed, stream, round, ...)``, so a run's choices depend
only on the experiment seed, never on worker count or completion order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

SAMPLING_STREAM = 1  # which clients a round selects
CLIENT_STREAM = 2  # a client's local batch order (and feature noise)
VIRTUAL_CLIENT_STREAM = 3  # FedVC's per-round sample draw
# Who reports: round 0 holds the per-client constants (availability: slot 0, speed: slot 1);
# round r >= 1, (client, slot): whether that sampled client reports this round.
DROPOUT_STREAM = 4


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


class DropoutConfig(Protocol):
    """The dropout and straggler settings of engine.FederationConfig (read-only)."""

    @property
    def seed(self) -> int: ...

    @property
    def dropout(self) -> float: ...

    @property
    def availability_concentration(self) -> float | None: ...

    @property
    def deadline_steps(self) -> int | None: ...

    @property
    def speed_spread(self) -> float: ...

    @property
    def stragglers(self) -> str: ...


def client_availability(cfg: DropoutConfig, client: int) -> float:
    """Client ``client``'s probability of reporting when sampled: ``1 - dropout`` for every
    client, or (``availability_concentration`` k) a per-client draw from
    Beta(k (1 - dropout), k dropout), mean ``1 - dropout``, fixed for the run."""
    if cfg.dropout <= 0.0:
        return 1.0
    k = cfg.availability_concentration
    if k is None:
        return 1.0 - cfg.dropout
    rng = np.random.default_rng(derive_seed(cfg.seed, DROPOUT_STREAM, 0, client, 0))
    return float(rng.beta(k * (1.0 - cfg.dropout), k * cfg.dropout))


def client_speed(cfg: DropoutConfig, client: int) -> float:
    """Client ``client``'s speed relative to the deadline, fixed for the run: 1 for every
    client (``speed_spread`` 0), else exp(speed_spread * z) with z standard normal."""
    if cfg.speed_spread <= 0.0:
        return 1.0
    rng = np.random.default_rng(derive_seed(cfg.seed, DROPOUT_STREAM, 0, client, 1))
    return float(np.exp(cfg.speed_spread * rng.standard_normal()))


@dataclass(frozen=True)
class Outcome:
    """What one sampled client does this round (``fedcore.events.ClientRecord.status``)."""

    status: str  # reported | partial | dropped | straggler
    max_steps: int | None = None  # partial: the local steps it finishes before the deadline

    @property
    def trains(self) -> bool:
        return self.status in ("reported", "partial")


REPORTED = Outcome("reported")


def dropout_active(cfg: DropoutConfig) -> bool:
    return cfg.dropout > 0.0 or cfg.deadline_steps is not None


def round_outcomes(
    cfg: DropoutConfig, round_: int, clients: Sequence[int], planned_steps: Sequence[int]
) -> list[Outcome]:
    """Which of the round's sampled ``clients`` (in sampling order; ``planned_steps``: the
    local steps each would take) report, decided before anything trains, from
    (seed, round, client, slot) alone. First dropout: a client reports with its availability;
    then the deadline: a client whose planned steps exceed ``deadline_steps x speed`` (floor)
    is a straggler: dropped (``stragglers: drop``) or its update cut at the steps it finished
    (``partial``; none finished: dropped). Without dropout or deadline nothing is drawn."""
    if not dropout_active(cfg):
        return [REPORTED] * len(clients)
    out: list[Outcome] = []
    for slot, (client, steps) in enumerate(zip(clients, planned_steps, strict=True)):
        if cfg.dropout > 0.0:
            rng = np.random.default_rng(derive_seed(cfg.seed, DROPOUT_STREAM, round_, client, slot))
            if rng.random() >= client_availability(cfg, client):
                out.append(Outcome("dropped"))
                continue
        if cfg.deadline_steps is not None:
            done = int(np.floor(cfg.deadline_steps * client_speed(cfg, client)))
            if steps > done:
                if cfg.stragglers == "partial" and done >= 1:
                    out.append(Outcome("partial", done))
                else:
                    out.append(Outcome("straggler"))
                continue
        out.append(REPORTED)
    return out
