"""FedProx, FedNova and FedOpt: equivalences with FedAvg and hand-computed server steps."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

from fedcore.aggregate import normalized_average, sgd_normalizer
from fedcore.algorithms import FedAvg, algorithm_options, build_algorithm
from fedcore.algorithms.base import ClientUpdate, ClientView
from fedcore.algorithms.fednova import FedNova
from fedcore.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedcore.algorithms.fedprox import FedProx
from fedcore.client import LocalConfig
from fedcore.errors import ConfigError
from tests.helpers import make_sim

SHARDS = np.array_split(np.arange(400), 4)


def run(algorithm, shards=SHARDS, rounds=2, **kw):
    sim = make_sim(shards, rounds=rounds, algorithm=algorithm, **kw)
    return sim, sim.run()


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---- FedProx --------------------------------------------------------------------------------


def test_fedprox_mu_zero_is_fedavg_bit_for_bit():
    ref, _ = run(FedAvg())
    prox, _ = run(FedProx(mu=0.0))
    assert_states_equal(ref.global_state, prox.global_state)


def test_fedprox_objective_adds_half_mu_squared_distance():
    logits, y = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    params = {"w": torch.tensor([1.0, 2.0])}
    loss = FedProx(mu=0.5).client_objective(
        {"w": torch.zeros(2)}, ClientView(torch.tensor([0]), {})
    )
    ce = torch.nn.functional.cross_entropy(logits, y)
    assert float(loss(logits, y, params) - ce) == pytest.approx(0.25 * 5.0)  # mu/2 * (1 + 4)


def test_fedprox_keeps_the_model_closer_to_the_global_one():
    init = make_sim(SHARDS).global_state
    drift = {}
    for mu in (0.0, 10.0):
        sim, _ = run(FedProx(mu=mu), rounds=1)
        drift[mu] = sum(float((sim.global_state[k] - init[k]).norm()) for k in ("0.weight",))
    assert drift[10.0] < drift[0.0]


# ---- FedNova --------------------------------------------------------------------------------


def test_sgd_normalizer_plain_and_momentum():
    assert sgd_normalizer(7) == 7.0
    # rho = 0.5, tau = 2: a constant gradient g moves the weights by g + 1.5 g = 2.5 g
    assert sgd_normalizer(2, 0.5) == pytest.approx(2.5)


def test_normalized_average_hand_computed():
    g = {"w": torch.tensor([0.0]), "bn.running_var": torch.tensor([1.0]), "n": torch.tensor(3)}
    a = {"w": torch.tensor([1.0]), "bn.running_var": torch.tensor([2.0]), "n": torch.tensor(4)}
    b = {"w": torch.tensor([2.0]), "bn.running_var": torch.tensor([4.0]), "n": torch.tensor(7)}
    out = normalized_average(g, [a, b], [1, 1], [1.0, 4.0], ["w"])
    # d = 0.5 (0-1)/1 + 0.5 (0-2)/4 = -0.75, tau_eff = 2.5 -> w = 1.875 (FedAvg: 1.5)
    assert out["w"].item() == pytest.approx(1.875)
    assert out["bn.running_var"].item() == pytest.approx(3.0)  # averaged, never normalized
    assert out["n"].item() == 7  # counters take the max


def test_fednova_with_equal_steps_is_fedavg():
    ref, _ = run(FedAvg())  # 4 x 100 samples, batch 16: tau_i = 7 for everyone
    nova, hist = run(FedNova())
    for k, v in ref.global_state.items():
        assert torch.allclose(v.double(), nova.global_state[k].double(), atol=1e-6), k
    assert hist.rounds[0].extra["tau_mean"] == 7.0
    assert hist.rounds[0].extra["tau_eff"] == pytest.approx(sgd_normalizer(7, 0.9))


def test_fednova_unequal_steps_stays_finite_with_batchnorm():
    shards = [np.arange(0, 20), np.arange(20, 60), np.arange(60, 400)]  # tau = 2, 3, 22 per epoch
    local = LocalConfig(local_epochs=2, batch_size=16, momentum=0.9, weight_decay=5e-4)
    sim, hist = run(FedNova(), shards=shards, rounds=3, local=local)
    assert all(torch.isfinite(v.float()).all() for v in sim.global_state.values())
    assert (sim.global_state["1.running_var"] > 0).all()
    assert hist.rounds[-1].extra["tau_mean"] == pytest.approx((4 + 6 + 44) / 3)
    assert all(np.isfinite(r.test_loss) for r in hist.rounds)
    ups = [ClientUpdate(i, {}, 1, t, 0.0, 0) for i, t in enumerate((4, 6, 44))]
    assert FedNova().round_extra(1, []) == {}
    assert FedNova().normalizers(ups) == [4.0, 6.0, 44.0]  # not set up: plain SGD


# ---- FedOpt ---------------------------------------------------------------------------------


def test_server_sgd_lr1_without_momentum_is_fedavg():
    ref, _ = run(FedAvg(), rounds=3)
    opt, _ = run(FedAvgM(server_lr=1.0, momentum=0.0), rounds=3)
    assert_states_equal(ref.global_state, opt.global_state)


def one_step(algo, x, target):
    return algo.server_update({"w": torch.tensor([x])}, {"w": torch.tensor([target])}, 1)


@pytest.mark.parametrize(
    ("algo", "expected_v"),
    [
        (FedAdagrad(server_lr=0.1, beta1=0.9, tau=0.1), 0.01 + 4.0),
        (FedAdam(server_lr=0.1, beta1=0.9, beta2=0.99, tau=0.1), 0.99 * 0.01 + 0.01 * 4.0),
        (FedYogi(server_lr=0.1, beta1=0.9, beta2=0.99, tau=0.1), 0.01 + 0.01 * 4.0),
    ],
)
def test_adaptive_step_hand_computed(algo, expected_v):
    out = one_step(algo, 1.0, 3.0)  # Delta = 2, m_0 = 0.1 * 2, v_{-1} = tau^2 = 0.01
    expected = 1.0 + 0.1 * 0.2 / (expected_v**0.5 + 0.1)
    assert out["w"].item() == pytest.approx(expected, rel=1e-6)
    assert algo.state_dict()["step"] == 1


def test_server_momentum_hand_computed():
    algo = FedAvgM(server_lr=0.5, momentum=0.9)
    assert one_step(algo, 0.0, 2.0)["w"].item() == pytest.approx(1.0)  # m = 2
    # m = 0.9 * 2 + 2 = 3.8 -> 1 + 0.5 * 3.8
    assert one_step(algo, 1.0, 3.0)["w"].item() == pytest.approx(2.9)


@pytest.mark.parametrize("name", ["fedavgm", "fedadagrad", "fedadam", "fedyogi"])
def test_server_state_survives_a_checkpoint(name):
    a = build_algorithm(name)
    for x, t in ((0.0, 1.0), (0.4, 0.2)):
        one_step(a, x, t)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)  # as a checkpoint stores it
    b, fresh = build_algorithm(name), build_algorithm(name)
    b.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    nxt_a, nxt_b = one_step(a, 0.5, 0.9), one_step(b, 0.5, 0.9)
    assert torch.equal(nxt_a["w"], nxt_b["w"])
    assert not torch.equal(one_step(fresh, 0.5, 0.9)["w"], nxt_a["w"])  # state mattered
    assert b.state_dict()["step"] == 3


def test_buffers_skip_the_server_optimizer():
    algo = FedAdam()
    sim = make_sim(SHARDS, algorithm=algo)  # setup: the optimiser knows the parameter names
    sim.run()
    assert "1.running_mean" not in algo.state_dict()["m"]
    assert "1.weight" in algo.state_dict()["m"]


class PoisonedAdam(FedAdam):
    def client_objective(self, global_state, client):
        return lambda logits, y, params: logits.sum() * float("nan")


def test_all_rejected_round_advances_no_server_state():
    algo = PoisonedAdam()
    sim = make_sim(SHARDS, rounds=2, algorithm=algo)
    before = {k: v.clone() for k, v in sim.global_state.items()}
    hist = sim.run()
    assert [r.rejected for r in hist.rounds] == [4, 4]
    assert algo.state_dict() == {"step": 0, "m": {}, "v": {}}
    assert_states_equal(before, sim.global_state)


def test_server_state_is_not_pickled_to_workers():
    algo = FedAdam(server_lr=0.5)
    one_step(algo, 0.0, 1.0)
    clone = pickle.loads(pickle.dumps(algo))
    assert clone == algo and clone.server == {}
    assert algo.state_dict()["step"] == 1


# ---- FedOpt: seed 002's Algorithms 3 and 4, Yogi's second branch ----------------------------


def _server_step(algo, x: float, target: float) -> float:
    out = algo.server_update({"w": torch.tensor([x])}, {"w": torch.tensor([target])}, 1)
    return out["w"].item()


def test_fedadagrad_follows_algorithm_3_with_lr_decay():
    """Seed 002's Algorithm 3 (FedAdagrad, ``form: seed002``): no momentum, lr decay."""
    algo = build_algorithm(
        "fedadagrad", {"form": "seed002", "server_lr": 0.1, "tau": 0.1, "lr_decay": 0.5}
    )
    # t = 1: g = -Delta = -2, s = 0 + 4, gamma = 0.1 -> x = 1 + 0.1 * 2 / (2 + 0.1)
    assert _server_step(algo, 1.0, 3.0) == pytest.approx(1.0 + 0.2 / 2.1, rel=1e-6)
    # t = 2: g = -1, s = 5, gamma = 0.1 / (1 + 0.5) -> x = 0 + gamma * 1 / (sqrt(5) + 0.1)
    assert _server_step(algo, 0.0, 1.0) == pytest.approx((0.1 / 1.5) / (5**0.5 + 0.1), rel=1e-6)
    assert algo.state_dict()["m"] == {}  # no momentum in Algorithm 3
    start = build_algorithm("fedadagrad", {"form": "seed002", "initial_accumulator": 5.0})
    # s_0 = 5: s_1 = 9 -> 1 + 0.01 * 2 / (3 + 0.001)
    assert _server_step(start, 1.0, 3.0) == pytest.approx(1.0 + 0.02 / 3.001, rel=1e-6)


def test_fedadam_follows_algorithm_4_with_bias_correction():
    """Seed 002's Algorithm 4 (FedAdam, ``form: seed002``): bias-corrected moments."""
    algo = build_algorithm(
        "fedadam", {"form": "seed002", "server_lr": 0.1, "tau": 0.1, "beta2": 0.99}
    )
    # t = 1: m = -0.2, v = 0.04; m^ = -2, v^ = 4 -> x = 1 + 0.1 * 2 / (2 + 0.1)
    assert _server_step(algo, 1.0, 3.0) == pytest.approx(1.0 + 0.2 / 2.1, rel=1e-6)
    # t = 2: g = -1: m = -0.28, v = 0.0496; m^ = -0.28 / 0.19, v^ = 0.0496 / 0.0199
    m_hat, v_hat = 0.28 / 0.19, 0.0496 / 0.0199
    assert _server_step(algo, 0.0, 1.0) == pytest.approx(0.1 * m_hat / (v_hat**0.5 + 0.1), rel=1e-6)
    # Reddi et al.'s form stays the default (no bias correction: a different first step)
    reddi = build_algorithm("fedadam", {"server_lr": 0.1, "tau": 0.1})
    assert reddi.form == "reddi"
    assert _server_step(reddi, 1.0, 3.0) == pytest.approx(
        1.0 + 0.1 * 0.2 / ((0.99 * 0.01 + 0.01 * 4) ** 0.5 + 0.1), rel=1e-6
    )


def test_fedopt_form_and_decay_options():
    """Seed 002's options: ``form`` (FedAdam), ``lr_decay`` and ``initial_accumulator``
    (FedAdagrad); Yogi has no seed 002 form and Algorithm 4 no lr decay."""
    assert "form" in algorithm_options("fedadam")
    assert {"lr_decay", "initial_accumulator"} <= set(algorithm_options("fedadagrad"))
    with pytest.raises(ConfigError):
        build_algorithm("fedyogi", {"form": "seed002"})  # Yogi is not in seed 002
    with pytest.raises(ConfigError):
        build_algorithm("fedadam", {"lr_decay": 0.1})  # Algorithm 4 has no decay


def test_yogi_second_branch_v_above_delta_squared():
    """sign(v - Delta^2) = +1: v shrinks, v_0 = tau^2 - (1 - beta2) Delta^2."""
    algo = FedYogi(server_lr=0.1, beta1=0.9, beta2=0.99, tau=3.0)  # v_{-1} = 9 > Delta^2 = 4
    v = 9.0 - 0.01 * 4.0  # Adam would give 0.99 * 9 + 0.04 = 8.95, the other branch 9.04
    assert _server_step(algo, 1.0, 3.0) == pytest.approx(1.0 + 0.1 * 0.2 / (v**0.5 + 3.0))
    assert algo.state_dict()["v"]["w"].item() == pytest.approx(v)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [3, 1]])
def test_aggregation_from_a_stack_equals_client_by_client(rows):
    """A cohort's uploads are rows of one stack (payload.Row): FedAvg's and FedNova's
    aggregation reduce the stack in one call per tensor, equal to the per-client sums."""
    from fedcore.aggregate import weighted_average
    from fedcore.payload import Row

    g = torch.Generator().manual_seed(0)
    stack = {
        "w": torch.randn(4, 6, 3, generator=g, dtype=torch.float64),
        "b": torch.randn(4, 3, generator=g).float(),
        "n": torch.tensor([3, 9, 4, 1]),
    }
    stacked = [Row(stack, i) for i in rows]
    own = [{k: v[i].clone() for k, v in stack.items()} for i in rows]
    weights = [5.0, 2.0, 7.0, 1.0][: len(rows)]
    a, b = weighted_average(stacked, weights), weighted_average(own, weights)
    assert a.keys() == b.keys() and a["n"] == b["n"] and a["b"].dtype == torch.float32
    for k in ("w", "b"):
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-12 if k == "w" else 1e-7), k
    glob = {k: v[0].clone() + 0.5 for k, v in stack.items() if k != "n"} | {"n": stack["n"][0]}
    norms = [3.0, 0.0, 5.0, 2.0][: len(rows)]  # a client without steps contributes nothing
    a = normalized_average(glob, stacked, weights, norms, ["w", "b"])
    b = normalized_average(glob, own, weights, norms, ["w", "b"])
    for k in ("w", "b"):
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-12 if k == "w" else 1e-6), k


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("fedavgm", {}),
        ("fedadagrad", {}),
        ("fedadam", {}),
        ("fedyogi", {}),
        ("fedadagrad", {"form": "seed002"}),
        ("fedadam", {"form": "seed002"}),
    ],
)
def test_server_moments_follow_the_model_to_its_device_after_a_resume(name, opts):
    """A checkpoint loads the moments on the CPU while the cohort engine keeps the model on
    its device (here the meta device stands in for CUDA): the first step after the resume
    moves them there instead of failing on mixed devices."""
    a = build_algorithm(name, **opts)
    for x, t in ((0.0, 1.0), (0.4, 0.2)):
        one_step(a, x, t)
    saved = a.state_dict()
    assert all(
        v.device.type == "cpu" and v is not a.server[k][key]
        for k in ("m", "v")
        for key, v in saved[k].items()
    )  # copies on the CPU
    b = build_algorithm(name, **opts)
    b.load_state_dict(saved)
    on_meta = {"w": torch.tensor([0.5], device="meta")}
    out = b.server_update(on_meta, {"w": torch.tensor([0.9], device="meta")}, 3)
    assert out["w"].device.type == "meta"
    assert {v.device.type for k in ("m", "v") for v in b.server.get(k, {}).values()} == {"meta"}


def test_fednova_unequal_weights_hand_computed():
    """Weights 1:3 (p = 1/4, 3/4), normalisers a = 1 and 4, global w = 0, clients 1 and 2.

    d = 1/4 (0 - 1)/1 + 3/4 (0 - 2)/4 = -0.625; tau_eff = 1/4 * 1 + 3/4 * 4 = 3.25;
    w' = 0 - 3.25 * -0.625 = 2.03125 (FedAvg: 1.75; tau_eff as the plain mean 2.5: 1.5625).
    """
    g = {"w": torch.tensor([0.0]), "bn.running_mean": torch.tensor([0.0])}
    a = {"w": torch.tensor([1.0]), "bn.running_mean": torch.tensor([4.0])}
    b = {"w": torch.tensor([2.0]), "bn.running_mean": torch.tensor([8.0])}
    out = normalized_average(g, [a, b], [1, 3], [1.0, 4.0], ["w"])
    assert out["w"].item() == pytest.approx(2.03125)
    assert out["bn.running_mean"].item() == pytest.approx(7.0)  # 1/4 * 4 + 3/4 * 8

    # The same case through the algorithm: n_k = 10 and 30 samples, tau = 1 and 4 plain SGD
    # steps (not set up: momentum 0, a_i = tau_i).
    ups = [
        ClientUpdate(0, {"w": torch.tensor([1.0])}, 10, 1, 0.0, 0),
        ClientUpdate(1, {"w": torch.tensor([2.0])}, 30, 4, 0.0, 0),
    ]
    nova = FedNova()
    assert nova.aggregate({"w": torch.tensor([0.0])}, ups)["w"].item() == pytest.approx(2.03125)
    assert nova.round_extra(1, ups) == {"tau_mean": 2.5, "tau_eff": pytest.approx(3.25)}
