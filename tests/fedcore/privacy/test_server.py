"""fedcore.privacy.server: the round's DP-FedAvg release recomputed by hand, the accountant
against dp-accounting, calibration, the budget stop, adaptive clipping and resume."""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant

from fedcore.errors import ConfigError
from fedcore.privacy import mechanisms as mech
from fedcore.privacy.accountant import PrivacyBudgetExceeded
from fedcore.privacy.server import DpConfig, DpServer

COVERED = ("fc.weight", "fc.bias")


@dataclass
class Up:
    client_id: int
    state: dict


def global_model() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "fc.weight": torch.randn(6, 4, generator=g),
        "fc.bias": torch.randn(6, generator=g),
        "bn.running_mean": torch.zeros(6),
        "bn.num_batches_tracked": torch.tensor(3),
    }


def uploads(glob: dict, ids, scale: float = 1.0, seed: int = 0) -> list[Up]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for cid in ids:
        state = {k: v + torch.randn(v.shape, generator=g) * scale * (cid + 1) for k, v in
                 glob.items() if v.is_floating_point()}  # fmt: skip
        out.append(Up(cid, state))
    return out


def server(**kw) -> DpServer:
    cfg = {k: kw.pop(k) for k in list(kw) if k in DpConfig.__dataclass_fields__}
    args = dict(sampling="fixed", population=100, cohort=10, rounds=20, seed=3) | kw
    return DpServer(DpConfig(**cfg), **args)


def test_a_round_is_clip_sum_noise_over_the_expected_cohort_by_hand():
    glob = global_model()
    ups = uploads(glob, [4, 1, 9])
    dp = server(clip=0.5, noise_multiplier=1.3)
    out = dp.release(glob, ups, 2, COVERED)
    total = {k: torch.zeros(glob[k].shape, dtype=torch.float64) for k in COVERED}
    for u in sorted(ups, key=lambda u: u.client_id):  # the sum in client-id order
        delta = {k: u.state[k] - glob[k] for k in COVERED}
        norm = math.sqrt(sum(float(delta[k].double().square().sum()) for k in sorted(COVERED)))
        for k in COVERED:
            total[k] += (delta[k] * min(1.0, 0.5 / norm)).double()
    for k in COVERED:
        gen = torch.Generator().manual_seed(mech.noise_seed(3, 2, mech.CENTRAL, -1, k))
        noise = torch.randn(glob[k].shape, generator=gen) * (1.3 * 0.5)
        want = glob[k] + (total[k].float() + noise) / 10
        assert torch.equal(out.aggregated[k], want), k
    assert set(out.aggregated) == set(COVERED)  # buffers keep the global value
    assert out.extra["dp_clipped_clients"] == 3.0 and out.extra["dp_clip"] == 0.5
    assert out.extra["dp_noise_multiplier"] == 1.3


def test_the_order_clients_report_in_does_not_change_a_bit():
    glob = global_model()
    ups = uploads(glob, [4, 1, 9, 2])
    a = server(noise_multiplier=1.0).release(glob, ups, 5, COVERED).aggregated
    b = server(noise_multiplier=1.0).release(glob, ups[::-1], 5, COVERED).aggregated
    assert all(torch.equal(a[k], b[k]) for k in COVERED)


def test_one_clients_contribution_is_bounded_by_the_clip_whatever_it_sent():
    glob = global_model()
    ups = uploads(glob, range(5))
    dp = dict(clip=0.2, noise_multiplier=0.7)
    base = server(**dp).release(glob, ups, 1, COVERED).aggregated
    wild = [Up(0, {k: v * 1e6 for k, v in ups[0].state.items()}), *ups[1:]]
    moved = server(**dp).release(glob, wild, 1, COVERED).aggregated
    diff = {k: moved[k].double() - base[k].double() for k in COVERED}
    assert mech.global_norm(diff) <= 2 * 0.2 / 10 * (1 + 1e-5)  # replace-one: 2C / m


def test_a_round_nobody_reported_still_releases_noise():
    glob = global_model()
    out = server(clip=1.0, noise_multiplier=2.0).release(glob, [], 4, COVERED)
    for k in COVERED:
        gen = torch.Generator().manual_seed(mech.noise_seed(3, 4, mech.CENTRAL, -1, k))
        assert torch.equal(out.aggregated[k], glob[k] + torch.randn(glob[k].shape, generator=gen)
                           * 2.0 / 10)  # fmt: skip


def test_the_noise_std_is_z_c_over_m():
    glob = {"w": torch.zeros(200_000)}
    out = server(clip=0.3, noise_multiplier=1.5).release(glob, [], 1, ["w"])
    assert float(out.aggregated["w"].std()) == pytest.approx(1.5 * 0.3 / 10, rel=0.01)
    assert abs(float(out.aggregated["w"].mean())) < 1e-3


def test_epsilon_per_round_is_dp_accountings_own():
    glob = global_model()
    dp = server(noise_multiplier=1.1, delta=1e-5)
    for r in (1, 2, 3):
        eps = dp.release(glob, uploads(glob, [0, 1]), r, COVERED).extra["dp_epsilon"]
        acc = rdp_privacy_accountant.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            100, 10, dp_accounting.GaussianDpEvent(1.1 / 2)
        )
        want = acc.compose(dp_accounting.SelfComposedDpEvent(event, r)).get_epsilon(1e-5)
        assert eps == pytest.approx(want, rel=1e-12)
        assert dp.epsilon == eps


def test_a_target_alone_calibrates_z_to_spend_it_over_the_planned_rounds():
    dp = server(target_epsilon=4.0, rounds=20)
    assert dp.accountant.setting.epsilon(20) <= 4.0
    assert dp.rounds_within_budget(20) is None  # calibrated: the whole run fits
    looser = server(noise_multiplier=dp.noise_multiplier - 1e-3)
    assert looser.accountant.setting.epsilon(20) > 4.0  # the least z that meets it


def test_with_z_given_the_target_is_a_budget_that_stops_the_run_before_overspending():
    glob = global_model()
    dp = server(noise_multiplier=2.0, target_epsilon=5.0, rounds=50)
    last = dp.rounds_within_budget(50)
    assert last is not None and 1 <= last < 50
    for r in range(1, last + 1):
        dp.check_next_round()
        dp.release(glob, [], r, COVERED)
    assert dp.epsilon <= 5.0
    with pytest.raises(PrivacyBudgetExceeded, match=f"round {last + 1} would spend"):
        dp.check_next_round()


def test_adaptive_clipping_moves_c_and_resumes_bit_for_bit():
    glob = global_model()
    cfg = dict(clip=0.1, noise_multiplier=1.0,
               adaptive_clip=mech.AdaptiveClipConfig(initial_clip=0.1, count_stddev=1.0))  # fmt: skip
    dp = server(**cfg)
    assert dp.sum_multiplier > dp.noise_multiplier  # the count takes its share of the budget
    for r in (1, 2):
        dp.release(glob, uploads(glob, [0, 3, 5], seed=r), r, COVERED)
    assert dp.clip != 0.1
    state = dp.state_dict()
    again = server(**cfg)
    again.load_state_dict(state)
    a = dp.release(glob, uploads(glob, [1, 2], seed=9), 3, COVERED)
    b = again.release(glob, uploads(glob, [1, 2], seed=9), 3, COVERED)
    assert a.extra == b.extra
    assert all(torch.equal(a.aggregated[k], b.aggregated[k]) for k in COVERED)
    with pytest.raises(ConfigError, match="privacy settings differ"):
        server(noise_multiplier=1.2, clip=0.1,
               adaptive_clip=cfg["adaptive_clip"]).load_state_dict(state)  # fmt: skip
    with pytest.raises(ConfigError, match="adaptive_clip differs"):
        server(clip=0.1, noise_multiplier=1.0).load_state_dict(state)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(clip=0.0, noise_multiplier=1.0), "privacy.clip must be a finite number > 0"),
        (dict(clip=-1.0, noise_multiplier=1.0), "privacy.clip"),
        (dict(), "give privacy.noise_multiplier"),
        (dict(noise_multiplier=-0.1), "privacy.noise_multiplier must be"),
        (dict(target_epsilon=0.0), "privacy.target_epsilon must be a finite number > 0"),
        (dict(noise_multiplier=1.0, delta=0.02), "privacy.delta must be a number in (0, 1/N)"),
        (dict(noise_multiplier=1.0, delta=0.0), "privacy.delta"),
        (dict(target_epsilon=1e-6, rounds=500), "cannot be met in 500 rounds"),
        (dict(noise_multiplier=1.0, accountant="pld"), "pld cannot account"),
        (dict(noise_multiplier=1.0, clip=0.5,
              adaptive_clip=mech.AdaptiveClipConfig(initial_clip=0.1)), "starts from privacy.clip"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_naming_the_key(kw, needle):
    with pytest.raises(ConfigError) as err:
        server(**kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_duplicate_clients_or_int_entries_are_refused():
    glob = global_model()
    ups = uploads(glob, [1, 1])
    with pytest.raises(ValueError, match="distinct clients"):
        server(noise_multiplier=1.0).release(glob, ups, 1, COVERED)
    with pytest.raises(ValueError, match="float entries only"):
        server(noise_multiplier=1.0).release(glob, [], 1, ["bn.num_batches_tracked"])
