"""The server side of client-level DP-FedAvg for one run: the noise multiplier the run uses,
the round's noisy average of the clipped client deltas, and the privacy spent after it.

McMahan et al. 2018 ("Learning Differentially Private Recurrent Language Models", Alg. 1 with
uniform weights): the server takes each reporting client's update as a delta from the global
model it sent, clips the delta to L2 norm C over the entries the mechanism covers, sums the
clipped deltas in float64, adds N(0, (z C)^2) to the sum and divides by the *expected* cohort
size m (a denominator that depends on who reported would leak who did). The next global model
is the algorithm's own server step applied to ``global + noisy mean``: FedAvg adopts it,
FedAvgM/FedAdam/FedAdagrad/FedYogi take it as their pseudo-gradient's source.

- The covered entries are the trained parameters the clients upload (an adapter's trained
  entries only). Buffers such as BatchNorm's running statistics are left out: they would carry
  client data past the mechanism, so they keep the global model's value.
- A round where nobody reports still releases a noisy model (the sum is zero): the mechanism
  runs every round the accountant counts.
- ``target_epsilon`` alone calibrates z before round 1 so that ``rounds`` rounds spend at most
  that; with z given as well, the target is a budget: ``check_next_round`` stops the run
  before the round that would exceed it (``PrivacyBudgetExceeded``, one line).
- Adaptive clipping (Andrew et al. 2021): C moves after each round by a noisy count of the
  clients under it; the count's noise comes out of the budget (``split_noise_multiplier``),
  so the sum's noise multiplier is z_Delta > z and the accountant still accounts z.

Hand-written: the DP libraries ship accountants (``dp-accounting``, used in
``fedcore.privacy.accountant``) and per-example DP-SGD (Opacus), not a federated server step
over a dict of client updates. Nothing here imports the engine: it calls this object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fedcore.errors import ConfigError
from fedcore.privacy.accountant import (
    DpSetting,
    RoundAccountant,
    calibrate_noise_multiplier,
    check_target_epsilon,
)
from fedcore.privacy.mechanisms import (
    AdaptiveClip,
    AdaptiveClipConfig,
    check_clip,
    check_noise_multiplier,
    dp_fedavg,
    noisy_mean,
    split_noise_multiplier,
)

StateDict = dict[str, torch.Tensor]


class Upload(Protocol):
    """What the server holds of one client's round (``fedcore.algorithms.base.ClientUpdate``)."""

    @property
    def client_id(self) -> int: ...

    @property
    def state(self) -> Mapping[str, torch.Tensor]: ...


@dataclass(frozen=True)
class DpConfig:
    """Central DP-FedAvg's settings (``privacy.*`` in params); validated on construction."""

    clip: float = 1.0  # C; with adaptive clipping its value in round 1
    noise_multiplier: float | None = None  # z; None: calibrated from target_epsilon
    target_epsilon: float | None = None
    delta: float = 1e-5
    accountant: str = "rdp"  # rdp | pld (dp-accounting)
    adaptive_clip: AdaptiveClipConfig | None = None

    def __post_init__(self) -> None:
        check_clip(self.clip)
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ConfigError(
                "privacy: give privacy.noise_multiplier (the noise std over the clip norm), "
                "privacy.target_epsilon (z is then calibrated to it), or both (a budget)"
            )
        if self.noise_multiplier is not None:
            check_noise_multiplier(self.noise_multiplier)
        if self.target_epsilon is not None:
            check_target_epsilon(self.target_epsilon)
        if self.adaptive_clip is not None and self.adaptive_clip.initial_clip != self.clip:
            raise ConfigError(
                f"privacy.adaptive_clip starts from privacy.clip={self.clip:g}, not from "
                f"{self.adaptive_clip.initial_clip:g}"
            )


@dataclass(frozen=True)
class DpRoundResult:
    """One round's release: the state handed to the algorithm's server step and the record's
    numbers (``dp_*`` in the round's extra)."""

    aggregated: StateDict
    extra: dict[str, float]


class DpServer:
    """One run's central DP: built before round 1, stepped once per round, checkpointed."""

    def __init__(
        self,
        config: DpConfig,
        *,
        sampling: str,
        population: int,
        cohort: int,
        rounds: int,
        seed: int,
    ) -> None:
        """``sampling``: ``fixed`` (m of N without replacement) or ``poisson`` (each client
        with probability m / N); ``cohort``: m, its expectation under Poisson sampling."""
        self.config = config
        self.seed = seed
        self.cohort = cohort
        z = config.noise_multiplier
        budget = config.target_epsilon
        if z is None:
            assert budget is not None  # DpConfig refused neither
            z = calibrate_noise_multiplier(
                budget, rounds, sampling=sampling, population=population, cohort=cohort,
                delta=config.delta, accountant=config.accountant,
            )  # fmt: skip
        self.noise_multiplier = z
        self.accountant = RoundAccountant(
            DpSetting(z, sampling, population, cohort, config.delta, config.accountant), budget
        )
        if budget is not None and self.accountant.setting.epsilon(1) > budget:
            raise ConfigError(
                f"privacy.target_epsilon={budget:g} is spent by round 1 already (epsilon "
                f"{self.accountant.setting.epsilon(1):.4g} at delta {config.delta:g}): raise "
                "privacy.target_epsilon or privacy.noise_multiplier"
            )
        adaptive = config.adaptive_clip
        self.adaptive = None if adaptive is None else AdaptiveClip(adaptive)
        # the sum's noise multiplier: the count query of adaptive clipping takes its share
        self.sum_multiplier = (
            z if adaptive is None else split_noise_multiplier(z, adaptive.count_stddev)
        )

    @property
    def clip(self) -> float:
        """This round's clip norm C."""
        return self.config.clip if self.adaptive is None else self.adaptive.clip_norm

    @property
    def epsilon(self) -> float:
        """epsilon(delta) spent so far."""
        return self.accountant.epsilon

    def rounds_within_budget(self, rounds: int) -> int | None:
        """The last round the budget allows when ``rounds`` are planned (None: all of them)."""
        at = self.accountant.exceeded_at(rounds)
        return None if at is None else at - 1

    def next_round_allowed(self) -> bool:
        """Whether one more round stays within the budget (always, without a target)."""
        target = self.accountant.target_epsilon
        return (
            target is None or self.accountant.setting.epsilon(self.accountant.rounds + 1) <= target
        )

    def check_next_round(self) -> None:
        """``PrivacyBudgetExceeded`` (one line) when the next round would overspend."""
        self.accountant.check_next_round()

    def release(
        self,
        global_state: Mapping[str, torch.Tensor],
        updates: Sequence[Upload],
        round_: int,
        keys: Iterable[str],
    ) -> DpRoundResult:
        """Round ``round_``'s noisy average over ``keys`` (the covered entries): the global
        value plus (sum of the clipped deltas + N(0, (z C)^2)) / m, in each entry's dtype.
        ``updates``: the reporting clients' decoded uploads (distinct clients; none: a round
        where nobody reported still releases noise)."""
        keys = sorted(keys)
        for k in keys:
            if not global_state[k].is_floating_point():
                raise ValueError(f"DP covers float entries only ({k} is {global_state[k].dtype})")
        ids = [u.client_id for u in updates]
        if len(set(ids)) != len(ids):
            raise ValueError(f"DP-FedAvg needs distinct clients per round (got {ids})")
        clip = self.clip
        deltas = {
            u.client_id: {k: u.state[k].detach() - global_state[k].detach() for k in keys}
            for u in updates
        }
        norms: dict[int, float] = {}
        clipped = 0
        if deltas:
            out = dp_fedavg(
                deltas, clip_norm=clip, noise_multiplier=self.sum_multiplier,
                expected_cohort=self.cohort, seed=self.seed, round_=round_,
            )  # fmt: skip
            mean, norms, clipped = out.mean, out.norms, out.clipped
        else:
            zeros = {k: torch.zeros_like(global_state[k]) for k in keys}
            mean = noisy_mean(
                zeros, noise_multiplier=self.sum_multiplier, clip_norm=clip,
                expected_cohort=self.cohort, seed=self.seed, round_=round_,
            )  # fmt: skip
        aggregated = {k: global_state[k].detach() + mean[k] for k in keys}
        epsilon = self.accountant.step()
        if self.adaptive is not None:
            self.adaptive.update(norms, expected_cohort=self.cohort, seed=self.seed, round_=round_)
        extra = {
            "dp_epsilon": epsilon,
            "dp_clip": clip,
            "dp_clipped_clients": float(clipped),
            "dp_noise_multiplier": self.noise_multiplier,
        }
        return DpRoundResult(aggregated, extra)

    # ---- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: the accountant's rounds and, with adaptive clipping, C."""
        state: dict[str, Any] = {"accountant": self.accountant.state_dict()}
        if self.adaptive is not None:
            state["adaptive_clip"] = self.adaptive.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the accountant refuses a checkpoint of other settings (one line)."""
        self.accountant.load_state_dict(dict(state["accountant"]))
        if (self.adaptive is None) != ("adaptive_clip" not in state):
            raise ConfigError(
                "the checkpoint's privacy.adaptive_clip differs from params (set in one, not "
                "in the other); resume with the params the run started with"
            )
        if self.adaptive is not None:
            clip_norm = float(state["adaptive_clip"]["clip_norm"])
            if not (math.isfinite(clip_norm) and clip_norm > 0):
                raise ConfigError(f"the checkpoint's adaptive clip norm is {clip_norm!r}")
            self.adaptive.load_state_dict(state["adaptive_clip"])
