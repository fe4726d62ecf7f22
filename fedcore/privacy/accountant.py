"""Privacy accounting of client-level DP-FedAvg over rounds, through ``dp-accounting``.

One round of DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models", Alg. 1) is a sampled Gaussian mechanism on the sum of clipped client
updates: each client's update is clipped to L2 norm C and the server adds N(0, (z C)^2) to the
sum, z being the noise multiplier (``privacy.noise_multiplier``). R rounds are its R-fold
composition. The accounting follows the sampler that picks each round's cohort:

- ``fixed``: m of the N clients drawn uniformly without replacement (fedapt's
  ``federation.sampling: without_replacement``): dp-accounting's
  ``SampledWithoutReplacementDpEvent`` under the replace-one neighbouring relation (Wang,
  Balle, Kasiviswanathan 2019, Thm 27; N is public). Replacing one client's update moves the
  clipped sum by up to 2C, so the Gaussian's sensitivity is 2C and the event's noise
  multiplier is z / 2. Only the RDP accountant supports this event in dp-accounting 0.6.0.
- ``poisson``: each client joins independently with probability q = m / N (the cohort size
  varies, m is its expectation): ``PoissonSampledDpEvent`` under add-or-remove-one, where the
  sensitivity is C and the event's noise multiplier is z. RDP and PLD both support it.

Who drops out after being sampled does not change the accounting: the guarantee is that of
the sampler (a dropped client is a sampled client that contributed zero).

Errors are one-line ``ConfigError`` (a ``ValueError``) naming the ``privacy.`` key; a budget
that a run would exceed is a ``PrivacyBudgetExceeded`` that names the round.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np
from absl import logging as absl_logging
from dp_accounting import mechanism_calibration
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedcore.errors import ConfigError, FedaptError

# dp-accounting logs through absl, whose handler (made when absl is imported, attached to no
# logger) holds the sys.stderr of that moment; a later logging.shutdown(), which
# logging.config.dictConfig runs (Prefect's logging setup), closes that stream unless it is
# the process's own, e.g. a notebook's or a test runner's capture then goes dead. Give it the
# process's own stream, which it never closes.
absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__ or sys.stderr

SAMPLINGS = ("fixed", "poisson")
ACCOUNTANTS = ("rdp", "pld")
# Calibration searches z in (0, MAX_NOISE_MULTIPLIER]: a target that needs more noise than this
# cannot be met (beyond it the noise swamps any update; RDP's epsilon also floors near
# log(1/delta) / (max order - 1) however large z is).
MAX_NOISE_MULTIPLIER = 1e3
STATE_VERSION = 1


class PrivacyBudgetExceeded(FedaptError):
    """The next round would spend more than ``privacy.target_epsilon``: the run stops."""


@dataclass(frozen=True)
class DpSetting:
    """What one run's accounting depends on; validated on construction (one-line errors)."""

    noise_multiplier: float  # z: the noise std on the sum is z * C
    sampling: str  # fixed | poisson
    population: int  # N: clients the cohort is drawn from
    cohort: int  # m: clients per round (its expectation under poisson)
    delta: float
    accountant: str = "rdp"  # rdp | pld

    def __post_init__(self) -> None:
        check_sampling(self.sampling, self.accountant)
        check_population(self.population, self.cohort)
        check_delta(self.delta, self.population)
        check_noise_multiplier(self.noise_multiplier)

    def round_event(self) -> dp_accounting.DpEvent:
        """One round's DpEvent (see the module docstring for the sensitivity per sampling)."""
        if self.sampling == "fixed":
            return dp_accounting.SampledWithoutReplacementDpEvent(
                source_dataset_size=self.population,
                sample_size=self.cohort,
                event=dp_accounting.GaussianDpEvent(self.noise_multiplier / 2),
            )
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability=self.cohort / self.population,
            event=dp_accounting.GaussianDpEvent(self.noise_multiplier),
        )

    def event(self, rounds: int) -> dp_accounting.DpEvent:
        """The DpEvent of ``rounds`` rounds."""
        return dp_accounting.SelfComposedDpEvent(self.round_event(), rounds)

    def fresh_accountant(self) -> dp_accounting.PrivacyAccountant:
        relation = dp_accounting.NeighboringRelation
        if self.sampling == "fixed":  # check_sampling refused pld with fixed
            return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation.REPLACE_ONE)
        if self.accountant == "pld":
            return pld_privacy_accountant.PLDAccountant(relation.ADD_OR_REMOVE_ONE)
        return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation.ADD_OR_REMOVE_ONE)

    def epsilon(self, rounds: int) -> float:
        """epsilon(delta) after ``rounds`` rounds (0 rounds: 0; z = 0: infinity)."""
        check_rounds(rounds, allow_zero=True)
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        if self.sampling == "fixed" or self.accountant == "rdp":
            # What RdpAccountant.compose(SelfComposedDpEvent(e, r)).get_epsilon computes (its
            # RDP is r times one round's), bit for bit, without recomputing one round's RDP on
            # ~150 orders each round (0.2 s without replacement)
            orders, one_round = self._rdp_of_one_round
            return float(
                rdp_privacy_accountant.compute_epsilon(orders, rounds * one_round, self.delta)[0]
            )
        return float(self.fresh_accountant().compose(self.event(rounds)).get_epsilon(self.delta))

    @functools.cached_property
    def _rdp_of_one_round(self) -> tuple[np.ndarray, np.ndarray]:
        accountant = self.fresh_accountant().compose(self.round_event())
        assert isinstance(accountant, rdp_privacy_accountant.RdpAccountant)
        return accountant.orders, accountant.rdp


# --- validation: one line each, naming the key and the allowed values ---------------------------


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_sampling(sampling: object, accountant: object = "rdp") -> None:
    if sampling not in SAMPLINGS:
        raise ConfigError(
            f"privacy.sampling must be one of {', '.join(SAMPLINGS)} (got {sampling!r})"
        )
    if accountant not in ACCOUNTANTS:
        raise ConfigError(
            f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)} (got {accountant!r})"
        )
    if sampling == "fixed" and accountant == "pld":
        raise ConfigError(
            "privacy.accountant: pld cannot account privacy.sampling: fixed (dp-accounting's PLD has "
            "no sampling without replacement); use privacy.accountant: rdp or privacy.sampling: poisson"
        )


def check_population(population: object, cohort: object) -> None:
    if not isinstance(population, int) or isinstance(population, bool) or population < 1:
        raise ConfigError(f"partition.num_clients must be an integer >= 1 (got {population!r})")
    if not isinstance(cohort, int) or isinstance(cohort, bool) or not 1 <= cohort <= population:
        raise ConfigError(
            "the clients per round (federation.participation x partition.num_clients) must be "
            f"an integer in [1, {population}] (got {cohort!r})"
        )


def check_delta(delta: object, population: int) -> None:
    if not _finite_number(delta) or not 0 < delta < 1 / population:  # type: ignore[operator]
        raise ConfigError(
            f"privacy.delta must be a number in (0, 1/N) = (0, {1 / population:.3g}) for "
            f"N={population} clients (got {delta!r})"
        )


def check_noise_multiplier(noise_multiplier: object) -> None:
    if not _finite_number(noise_multiplier) or noise_multiplier < 0:  # type: ignore[operator]
        raise ConfigError(
            f"privacy.noise_multiplier must be a finite number >= 0 (got {noise_multiplier!r})"
        )


def check_target_epsilon(target_epsilon: object) -> None:
    if not _finite_number(target_epsilon) or target_epsilon <= 0:  # type: ignore[operator]
        raise ConfigError(
            f"privacy.target_epsilon must be a finite number > 0 (got {target_epsilon!r})"
        )


def check_rounds(rounds: object, *, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < low:
        raise ConfigError(f"federation.rounds must be an integer >= {low} (got {rounds!r})")


# --- the functions the engine calls before a run --------------------------------------------------


def epsilon_after(
    rounds: int,
    *,
    noise_multiplier: float,
    sampling: str,
    population: int,
    cohort: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """epsilon(delta) of DP-FedAvg after ``rounds`` rounds with noise multiplier z."""
    setting = DpSetting(noise_multiplier, sampling, population, cohort, delta, accountant)
    return setting.epsilon(rounds)


@functools.lru_cache(maxsize=64)  # a float of floats: the preflight's and the run's, once
def calibrate_noise_multiplier(
    target_epsilon: float,
    rounds: int,
    *,
    sampling: str,
    population: int,
    cohort: int,
    delta: float,
    accountant: str = "rdp",
    tol: float = 1e-4,
) -> float:
    """The smallest z (within ``tol``, rounded up) whose epsilon(delta) after ``rounds`` rounds
    is at most ``target_epsilon`` (dp-accounting's ``calibrate_dp_mechanism``, Brent's method).
    """
    check_target_epsilon(target_epsilon)
    check_rounds(rounds)

    def setting(z: float) -> DpSetting:
        return DpSetting(z, sampling, population, cohort, delta, accountant)

    most = setting(MAX_NOISE_MULTIPLIER).epsilon(rounds)
    if most > target_epsilon:
        raise ConfigError(
            f"privacy.target_epsilon={target_epsilon:g} cannot be met in {rounds} rounds at "
            f"privacy.delta={delta:g}: even noise multiplier {MAX_NOISE_MULTIPLIER:g} spends "
            f"epsilon {most:.4g}; raise privacy.target_epsilon or lower federation.rounds"
        )
    # A bracket [low, high] with epsilon(low) > target >= epsilon(high); z = 0 itself cannot be
    # an endpoint (infinite epsilon; the without-replacement RDP divides by z).
    # Doubling or halving from z = 1 keeps the bracket within a factor 2 (few Brent steps).
    low = high = 1.0
    if setting(1.0).epsilon(rounds) > target_epsilon:
        while setting(high).epsilon(rounds) > target_epsilon:  # ends: MAX meets the target
            low, high = high, min(2 * high, MAX_NOISE_MULTIPLIER)
    else:
        while setting(low).epsilon(rounds) <= target_epsilon:
            if low < tol:
                return tol  # (practically unreachable) almost no noise meets the target
            low, high = low / 2, low
    z = mechanism_calibration.calibrate_dp_mechanism(
        setting(1.0).fresh_accountant,
        lambda z: setting(z).event(rounds),
        target_epsilon,
        delta,
        mechanism_calibration.ExplicitBracketInterval(low, high),
        tol=tol,
    )
    # Brent returns a point within tol of the root, on either side: return the least multiple
    # k * tol that meets the target (never overspends, never adds a needless step of noise).
    k = math.ceil(float(z) / tol)
    while setting(k * tol).epsilon(rounds) > target_epsilon:
        k += 1
    while k > 1 and setting((k - 1) * tol).epsilon(rounds) <= target_epsilon:
        k -= 1
    return k * tol


# --- the stateful accountant the engine steps once per round -------------------------------------


class RoundAccountant:
    """epsilon(delta) after each round of one run, with an optional budget.

    The epsilon of round r is always computed from a fresh dp-accounting accountant composed
    with r rounds at once, so it depends on (setting, r) only: a run resumed from
    ``state_dict()`` reports bit-identical epsilons.
    """

    def __init__(self, setting: DpSetting, target_epsilon: float | None = None) -> None:
        if target_epsilon is not None:
            check_target_epsilon(target_epsilon)
        self.setting = setting
        self.target_epsilon = target_epsilon
        self.epsilons: list[float] = []  # epsilon after round 1, 2, ...

    @property
    def rounds(self) -> int:
        return len(self.epsilons)

    @property
    def epsilon(self) -> float:
        """epsilon(delta) spent so far (0 before the first round)."""
        return self.epsilons[-1] if self.epsilons else 0.0

    def check_next_round(self) -> None:
        """Raise ``PrivacyBudgetExceeded`` (one line) if the next round would overspend."""
        if self.target_epsilon is None:
            return
        upcoming = self.rounds + 1
        spent = self.setting.epsilon(upcoming)
        if spent > self.target_epsilon:
            raise PrivacyBudgetExceeded(
                f"round {upcoming} would spend epsilon {spent:.4g} > privacy.target_epsilon="
                f"{self.target_epsilon:g} (delta {self.setting.delta:g}); the run stops after "
                f"round {self.rounds}"
            )

    def step(self) -> float:
        """Account one more round; return the epsilon spent after it."""
        self.epsilons.append(self.setting.epsilon(self.rounds + 1))
        return self.epsilon

    def exceeded_at(self, max_rounds: int) -> int | None:
        """The first round <= ``max_rounds`` whose epsilon exceeds the target (None: none does,
        or no target). Epsilon grows with rounds, so this bisects."""
        check_rounds(max_rounds)
        target = self.target_epsilon
        if target is None or self.setting.epsilon(max_rounds) <= target:
            return None
        low, high = 0, max_rounds  # epsilon(low) <= target < epsilon(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self.setting.epsilon(mid) > target:
                high = mid
            else:
                low = mid
        return high

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON types, for checkpoints."""
        s = self.setting
        return {
            "version": STATE_VERSION,
            "noise_multiplier": s.noise_multiplier,
            "sampling": s.sampling,
            "population": s.population,
            "cohort": s.cohort,
            "delta": s.delta,
            "accountant": s.accountant,
            "target_epsilon": self.target_epsilon,
            "epsilons": list(self.epsilons),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RoundAccountant:
        accountant = cls(_setting_of(state), state["target_epsilon"])
        accountant.load_state_dict(state)
        return accountant

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the checkpoint must come from the same setting (else one-line error)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"checkpoint privacy accountant state has version {state.get('version')!r}; "
                f"this fedapt reads version {STATE_VERSION}"
            )
        if _setting_of(state) != self.setting or state["target_epsilon"] != self.target_epsilon:
            raise ConfigError(
                "the checkpoint's privacy settings differ from privacy.* in params "
                f"(checkpoint: {_setting_of(state)}, target {state['target_epsilon']}); "
                "resume with the params the run started with"
            )
        self.epsilons = [float(e) for e in state["epsilons"]]


def _setting_of(state: dict[str, Any]) -> DpSetting:
    return DpSetting(
        noise_multiplier=state["noise_multiplier"],
        sampling=state["sampling"],
        population=state["population"],
        cohort=state["cohort"],
        delta=state["delta"],
        accountant=state["accountant"],
    )
