"""fedcore.privacy.accountant against dp-accounting's own numbers (pfl-research's habit)."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedcore.errors import ConfigError
from fedcore.privacy import accountant as acc

NR = dp_accounting.NeighboringRelation


def dp_accounting_epsilon(z: float, sampling: str, n: int, m: int, rounds: int, delta: float,
                          kind: str = "rdp") -> float:  # fmt: skip
    """The same mechanism written out directly with dp-accounting (no fedapt code)."""
    if sampling == "fixed":  # replace-one: the clipped sum moves by 2C, so z/2 per sensitivity
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            n, m, dp_accounting.GaussianDpEvent(z / 2)
        )
        accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=NR.REPLACE_ONE)
    else:
        event = dp_accounting.PoissonSampledDpEvent(m / n, dp_accounting.GaussianDpEvent(z))
        accountant = (
            pld_privacy_accountant.PLDAccountant(NR.ADD_OR_REMOVE_ONE)
            if kind == "pld"
            else rdp_privacy_accountant.RdpAccountant(neighboring_relation=NR.ADD_OR_REMOVE_ONE)
        )
    return accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


CASES = [  # (z, sampling, N, m, rounds, delta, accountant)
    (1.1, "poisson", 1000, 50, 200, 1e-5, "rdp"),
    (1.1, "poisson", 1000, 50, 200, 1e-5, "pld"),
    (0.8, "poisson", 100, 10, 15, 1e-3, "rdp"),
    (2.0, "fixed", 1000, 50, 100, 1e-5, "rdp"),
    (4.0, "fixed", 100, 10, 15, 1e-3, "rdp"),
    (3.0, "fixed", 10, 10, 5, 1e-2, "rdp"),  # cross-silo: everyone every round (q = 1)
]


@pytest.mark.parametrize("z, sampling, n, m, rounds, delta, kind", CASES)
def test_epsilon_equals_dp_accounting(z, sampling, n, m, rounds, delta, kind):
    ours = acc.epsilon_after(
        rounds,
        noise_multiplier=z,
        sampling=sampling,
        population=n,
        cohort=m,
        delta=delta,
        accountant=kind,
    )
    assert ours == dp_accounting_epsilon(z, sampling, n, m, rounds, delta, kind)
    assert 0 < ours < math.inf


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    s = acc.DpSetting(1.0, "poisson", 1000, 50, 1e-5)
    eps = [s.epsilon(r) for r in (0, 1, 10, 100)]
    assert eps[0] == 0 and eps == sorted(eps) and len(set(eps)) == 4
    assert acc.DpSetting(2.0, "poisson", 1000, 50, 1e-5).epsilon(100) < eps[-1]
    assert acc.DpSetting(0.0, "poisson", 1000, 50, 1e-5).epsilon(1) == math.inf
    # fixed-size (replace-one, sensitivity 2C) spends more than Poisson at the same z
    assert acc.DpSetting(1.0, "fixed", 1000, 50, 1e-5).epsilon(100) > eps[-1]


@pytest.mark.parametrize(
    "target, sampling, n, m, rounds, delta, kind",
    [
        (2.0, "poisson", 1000, 50, 300, 1e-5, "rdp"),
        (0.5, "poisson", 1000, 50, 10, 1e-5, "pld"),
        (4.0, "fixed", 100, 10, 30, 1e-3, "rdp"),
        (50.0, "poisson", 200, 20, 50, 1e-4, "rdp"),  # little noise needed (z < 1)
    ],
)
def test_calibration_hits_the_target(target, sampling, n, m, rounds, delta, kind):
    kw = dict(sampling=sampling, population=n, cohort=m, delta=delta, accountant=kind)
    z = acc.calibrate_noise_multiplier(target, rounds, tol=1e-3, **kw)
    spent = acc.epsilon_after(rounds, noise_multiplier=z, **kw)
    assert spent <= target  # never overspends ...
    if kind == "rdp":  # ... with the least noise (PLD's discretisation is not monotone in z)
        assert acc.epsilon_after(rounds, noise_multiplier=round(z - 1e-3, 9), **kw) > target
    assert spent == pytest.approx(target, rel=0.02)


def test_round_accountant_steps_stops_and_resumes():
    setting = acc.DpSetting(1.0, "poisson", 1000, 50, 1e-5)
    target = setting.epsilon(12) + 1e-9  # round 13 is the first to overspend
    a = acc.RoundAccountant(setting, target_epsilon=target)
    assert a.exceeded_at(100) == 13 and a.exceeded_at(12) is None
    for r in range(1, 6):
        a.check_next_round()
        assert a.step() == setting.epsilon(r) == a.epsilon and a.rounds == r

    state = json.loads(json.dumps(a.state_dict()))  # plain JSON types survive a checkpoint
    assert state == a.state_dict()
    resumed = acc.RoundAccountant.from_state_dict(state)
    for _ in range(7):  # both run on to round 12: identical epsilons, bit for bit
        a.check_next_round()
        resumed.check_next_round()
        assert a.step() == resumed.step()
    assert a.epsilons == resumed.epsilons and len(a.epsilons) == 12
    assert a.state_dict() == resumed.state_dict()

    with pytest.raises(acc.PrivacyBudgetExceeded) as err:
        resumed.check_next_round()
    msg = str(err.value)
    assert "round 13" in msg and "privacy.target_epsilon" in msg and "\n" not in msg
    assert resumed.rounds == 12  # refusing a round spends nothing

    unlimited = acc.RoundAccountant(setting)
    unlimited.check_next_round()
    assert unlimited.exceeded_at(10) is None


def test_resume_refuses_other_settings():
    a = acc.RoundAccountant(acc.DpSetting(1.0, "poisson", 1000, 50, 1e-5), target_epsilon=3.0)
    a.step()
    other = acc.RoundAccountant(acc.DpSetting(1.2, "poisson", 1000, 50, 1e-5), target_epsilon=3.0)
    with pytest.raises(ConfigError, match="privacy"):
        other.load_state_dict(a.state_dict())
    with pytest.raises(ConfigError, match="version"):
        other.load_state_dict({**a.state_dict(), "version": 99})


# --- bad inputs: one line each, naming the key ---------------------------------------------------

GOOD = dict(noise_multiplier=1.0, sampling="poisson", population=100, cohort=10, delta=1e-4)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"delta": 0.0}, "privacy.delta"),
        ({"delta": -1e-5}, "privacy.delta"),
        ({"delta": 0.01}, "privacy.delta"),  # = 1/N
        ({"delta": 0.5}, "privacy.delta"),
        ({"delta": float("nan")}, "privacy.delta"),
        ({"delta": "1e-5"}, "privacy.delta"),
        ({"noise_multiplier": -0.1}, "privacy.noise_multiplier"),
        ({"noise_multiplier": float("inf")}, "privacy.noise_multiplier"),
        ({"noise_multiplier": None}, "privacy.noise_multiplier"),
        ({"sampling": "with_replacement"}, "privacy.sampling"),
        ({"sampling": "fixed", "accountant": "pld"}, "privacy.accountant"),
        ({"accountant": "prv"}, "privacy.accountant"),
        ({"cohort": 0}, "clients per round"),
        ({"cohort": 101}, "clients per round"),
        ({"population": 0}, "partition.num_clients"),
    ],
)
def test_bad_setting_is_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        acc.epsilon_after(10, **{**GOOD, **override})
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert key in msg and "\n" not in msg


@pytest.mark.parametrize(
    "target, rounds, key",
    [
        (0.0, 10, "privacy.target_epsilon"),
        (-1.0, 10, "privacy.target_epsilon"),
        (float("inf"), 10, "privacy.target_epsilon"),
        (1e-3, 10, "privacy.target_epsilon"),  # no noise multiplier meets it
        (1.0, 0, "federation.rounds"),
        (1.0, 2.5, "federation.rounds"),
    ],
)
def test_bad_calibration_is_one_line_naming_the_key(target, rounds, key):
    kw = {k: v for k, v in GOOD.items() if k != "noise_multiplier"}
    with pytest.raises(ConfigError) as err:
        acc.calibrate_noise_multiplier(target, rounds, **kw)
    msg = str(err.value)
    assert key in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="privacy.target_epsilon"):
        acc.RoundAccountant(acc.DpSetting(**GOOD), target_epsilon=-1.0)
