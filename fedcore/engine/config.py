"""The federation's configuration (rounds, sampling, dropout, deadlines) and the initial model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedcore.errors import ConfigError


@dataclass(frozen=True)
class FederationConfig:
    rounds: int
    clients_per_round: int
    # "without_replacement": distinct clients each round (seed 004 §6.1.4, 10 of 100);
    # "with_replacement": independent uniform draws, a client drawn twice trains twice.
    sampling: str = "without_replacement"
    eval_every: int = 1  # 0: never evaluate (benchmarks)
    last_rounds: int = 5  # L of "mean accuracy of the last L rounds" (seed 004 §6.1.5)
    seed: int = 0
    # Clients that may not report (seed 000's cross-device setting; fedcore.sampling
    # round_outcomes, docs/accounting.md): a sampled client fails to report with probability
    # ``dropout`` (per client from Beta(k(1-d), k d) with ``availability_concentration`` k);
    # one whose local steps exceed ``deadline_steps`` x its speed (exp(speed_spread z) per
    # client) is a straggler: ``stragglers`` "drop" or "partial" (its update cut there).
    dropout: float = 0.0
    availability_concentration: float | None = None
    deadline_steps: int | None = None
    speed_spread: float = 0.0
    stragglers: str = "drop"
    # Train rounds 1..stop_after of a run configured for ``rounds`` (schedules and budgets
    # read ``rounds``), then end it as a budget would (stop_reason "stop_after"): the first
    # rounds of a run exactly, e.g. to check a record (``fedapt reproduce --revalidate``).
    stop_after: int | None = None
    # The last ``whole_test_last`` evaluations of the planned rounds measure every row of the
    # test split given to the simulation; the others only its ``test_rows`` (a reproduction's
    # verdict window on the whole split, its curve on a cheaper subset). 0: ``test_rows``
    # always.
    whole_test_last: int = 0

    def eval_rounds(self) -> list[int]:
        """The rounds the run evaluates when it runs to ``rounds``."""
        if not self.eval_every:
            return []
        return [
            r for r in range(1, self.rounds + 1) if r % self.eval_every == 0 or r == self.rounds
        ]

    def whole_test_rounds(self) -> frozenset[int]:
        """The rounds whose evaluations measure the whole test split (``whole_test_last``)."""
        if self.whole_test_last <= 0:
            return frozenset()
        return frozenset(self.eval_rounds()[-self.whole_test_last :])

    def __post_init__(self) -> None:
        if self.stop_after is not None and not 1 <= self.stop_after <= self.rounds:
            raise ConfigError(
                f"federation.stop_after must be in [1, rounds={self.rounds}] (got {self.stop_after})"
            )
        if self.whole_test_last < 0:
            raise ConfigError(
                f"federation.whole_test_last must be >= 0 (got {self.whole_test_last})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"federation.dropout must be in [0, 1) (got {self.dropout})")
        k = self.availability_concentration
        if k is not None and not k > 0.0:
            raise ConfigError(f"federation.availability_concentration must be > 0 (got {k})")
        if self.deadline_steps is not None and self.deadline_steps < 1:
            raise ConfigError(f"federation.deadline_steps must be >= 1 (got {self.deadline_steps})")
        if not self.speed_spread >= 0.0:
            raise ConfigError(f"federation.speed_spread must be >= 0 (got {self.speed_spread})")
        if self.stragglers not in ("drop", "partial"):
            raise ConfigError(
                f"federation.stragglers must be one of drop, partial (got {self.stragglers!r})"
            )


def initial_model(model_fn: Callable[[], nn.Module], federation: FederationConfig) -> nn.Module:
    """The run's initial global model: built right after seeding torch with the run's seed, so
    its weights depend on the seed alone. A caller that needs the model before the Simulation
    exists (its payload keys, sizes) builds it here and passes it as ``model``."""
    torch.manual_seed(federation.seed)
    return model_fn()
