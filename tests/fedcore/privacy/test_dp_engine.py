"""Client-level DP-FedAvg in the round (issue 48): the first round recomputed by hand from the
decoded uploads, cohort = sequential, resume byte-identical, the budget stop, adapters moving
only their trained entries, and the algorithms and samplings it refuses."""

from __future__ import annotations

import pytest
import torch

from fedcore import payload
from fedcore.errors import ConfigError
from fedcore.privacy.accountant import DpSetting
from fedcore.privacy.mechanisms import AdaptiveClipConfig
from fedcore.privacy.server import DpConfig, DpServer
from tests.fedcore.cohort.support import assert_same, simulate

DP = DpConfig(clip=0.5, noise_multiplier=0.8)


def test_the_first_round_is_dp_fedavg_of_the_decoded_uploads_by_hand():
    got: list = []  # the clients' decoded uploads, as the server received them
    start = {}  # the initial global model

    class Hook(list):  # ``simulate`` hands it the Simulation before it runs
        def append(self, sim):
            start.update({k: v.clone() for k, v in sim.global_state.items()})
            train = sim.backend.train

            def spy(*args, **kw):
                results = train(*args, **kw)
                got.extend(r.update() for r in results if r is not None)
                return results

            sim.backend.train = spy
            super().append(sim)

    sims = Hook()
    glob, history, _ = simulate("sequential", "fedavg", rounds=1, privacy=DP, sims=sims)
    sim = sims[0]
    assert len(got) == 4
    keys = sim.private_keys
    assert keys and all(k in dict(sim.global_state) for k in keys)
    fresh = DpServer(DP, sampling="fixed", population=5, cohort=4, rounds=1, seed=1)
    want = fresh.release(start, got, 1, keys)
    for k in glob:
        expected = want.aggregated[k] if k in keys else start[k]
        assert torch.equal(glob[k], expected), k
    assert history.rounds[0].extra["dp_epsilon"] == DpSetting(0.8, "fixed", 5, 4, 1e-5).epsilon(1)
    assert history.rounds[0].extra["dp_clip"] == 0.5


@pytest.mark.parametrize(
    ("algorithm", "adapter"), [("fedavg", "full"), ("fedadam", "full"), ("fedavg", "lora")]
)
def test_cohort_equals_sequential_with_dp(algorithm, adapter):
    a = simulate("sequential", algorithm, adapter, privacy=DP)
    b = simulate("cohort", algorithm, adapter, privacy=DP)
    assert_same(a, b)
    assert [r.extra["dp_epsilon"] for r in a[1].rounds] == [
        r.extra["dp_epsilon"] for r in b[1].rounds
    ]


def test_resume_is_byte_identical_with_adaptive_clipping():
    dp = DpConfig(
        clip=0.2, noise_multiplier=1.0, adaptive_clip=AdaptiveClipConfig(initial_clip=0.2)
    )
    whole, hist, _ = simulate("sequential", "fedavgm", rounds=3, privacy=dp)
    sims: list = []
    simulate("sequential", "fedavgm", rounds=3, stop_after=2, privacy=dp, sims=sims)
    state = sims[0].state_dict()
    assert "privacy" in state and "adaptive_clip" in state["privacy"]
    state["stop_reason"] = "rounds"  # continue it (stop_after ended it as a budget would)
    resumed, hist2, _ = simulate("sequential", "fedavgm", rounds=3, privacy=dp, resume=state)
    assert payload.encode(whole) == payload.encode(resumed)
    assert [r.extra for r in hist.rounds][2] == [r.extra for r in hist2.rounds][2]
    assert hist.rounds[2].extra["dp_clip"] != 0.2  # C moved
    with pytest.raises(ConfigError, match="privacy differs"):
        simulate("sequential", "fedavgm", rounds=3, resume=state)


def test_a_budget_stops_the_run_before_the_round_that_would_overspend():
    dp = DpConfig(clip=0.5, noise_multiplier=2.0, target_epsilon=7.0)
    setting = DpSetting(2.0, "fixed", 5, 4, 1e-5)
    last = max(r for r in range(1, 10) if setting.epsilon(r) <= 7.0)
    _, history, _ = simulate("sequential", "fedavg", rounds=last + 3, privacy=dp)
    assert history.stop_reason == "privacy_budget"
    assert len(history.rounds) == last
    assert history.rounds[-1].extra["dp_epsilon"] <= 7.0
    assert history.rounds[-1].accuracy is not None  # the last round is evaluated
    with pytest.raises(ConfigError, match="spent by round 1 already"):
        simulate("sequential", "fedavg", privacy=DpConfig(noise_multiplier=0.3, target_epsilon=1))


def test_an_adapter_run_moves_only_its_trained_entries():
    start = {}

    class Keep(list):
        def append(self, sim):
            start.update({k: v.clone() for k, v in sim.global_state.items()})
            super().append(sim)

    sims = Keep()
    glob, _, _ = simulate("sequential", "fedavg", "lora", privacy=DP, sims=sims)
    keys = set(sims[0].private_keys)
    assert keys and keys <= set(sims[0].trainable)
    for k, v in glob.items():
        assert torch.equal(v, start[k]) is (k not in keys), k


@pytest.mark.parametrize("algorithm", ["fednova", "scaffold", "fednilo", "fedvc", "fedir"])
def test_algorithms_whose_server_step_breaks_the_guarantee_are_refused(algorithm):
    with pytest.raises(ConfigError) as err:
        simulate("sequential", algorithm, privacy=DP)
    line = str(err.value)
    assert f"privacy (client-level DP) cannot run with {algorithm}: " in line
    assert "\n" not in line and "privacy: null" in line


def test_sampling_with_replacement_is_refused():
    with pytest.raises(ConfigError, match="federation.sampling: without_replacement"):
        simulate("sequential", "fedavg", privacy=DP, sampling="with_replacement")
