"""SCAFFOLD (fedcore.algorithms.scaffold): one round computed by hand (x, c, every c_k and
the bytes both ways, a straggler cut or dropped), c = mean of the N c_k under dropout,
checkpoints, and its one-line refusal of AdamW."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import RunSpec, build_algorithm
from fedcore.algorithms.base import MESSAGE, UPLOAD
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.events import Callback, ClientRecord
from fedcore.schedules import LRSchedule
from tests.helpers import Float64Images, tiny_cnn, toy_data

KEY = "1.weight"  # the linear layer's weight (2 classes x 2 features)
LR, SERVER_LR, N = 0.1, 0.5, 4


def linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False)).double()


# Each client's samples are copies of one image with one label: any batch order gives the
# same batches, so K (the local steps) and every gradient are known by hand.
PIXELS = [(200, 40), (30, 220), (120, 250), (90, 10)]  # one 1x2 image per client
LABELS = [0, 1, 1, 0]
SIZES = [4, 2, 6, 2]  # batch 2, one epoch: K = 2, 1, 3 (deadline 2: cut or dropped), 1


def federation_data() -> tuple[Float64Images, list[np.ndarray]]:
    images = torch.tensor(
        [PIXELS[k] for k in range(N) for _ in range(SIZES[k])], dtype=torch.uint8
    ).view(-1, 1, 1, 2)
    labels = torch.tensor([LABELS[k] for k in range(N) for _ in range(SIZES[k])])
    ends = np.cumsum([0, *SIZES])
    shards = [np.arange(ends[k], ends[k + 1]) for k in range(N)]
    return Float64Images(images, labels, (0.0,), (1.0,)), shards


class Clients(Callback):
    def __init__(self) -> None:
        self.records: list[ClientRecord] = []

    def on_client_end(self, record: ClientRecord) -> None:
        self.records.append(record)


C0 = torch.tensor([[0.05, -0.02], [-0.05, 0.02]], dtype=torch.float64)
CK0 = {
    0: torch.tensor([[0.10, 0.00], [-0.10, 0.00]], dtype=torch.float64),
    2: torch.tensor([[-0.03, 0.04], [0.03, -0.04]], dtype=torch.float64),
    3: torch.tensor([[0.02, 0.02], [-0.02, -0.02]], dtype=torch.float64),
}  # client 1 has no c_k yet: zero


def one_round(engine: str, stragglers: str) -> tuple[Simulation, Clients]:
    data, shards = federation_data()
    clients = Clients()
    sim = Simulation(
        model_fn=linear,
        algorithm=build_algorithm("scaffold", server_lr=SERVER_LR),
        train=data,
        test=data,
        shards=shards,
        local=LocalConfig(batch_size=2, momentum=0.0, weight_decay=0.0, local_epochs=1),
        lr_schedule=LRSchedule(lr=LR),
        federation=FederationConfig(
            rounds=1,
            clients_per_round=3,
            seed=3,
            eval_every=0,
            deadline_steps=2,
            stragglers=stragglers,
        ),
        workers=0,
        engine=engine,
        callbacks=[clients],
    )
    sim.algorithm.load_state_dict(
        {"c": {KEY: C0.clone()}, "clients": {k: {KEY: v.clone()} for k, v in CK0.items()}}
    )
    return sim, clients


@pytest.mark.parametrize("engine", ["sequential", "cohort"])
@pytest.mark.parametrize("stragglers", ["partial", "drop"])
def test_one_round_by_hand(engine, stragglers):
    sim, clients = one_round(engine, stragglers)
    x = sim.global_state[KEY].clone()
    history = sim.run()
    record = history.rounds[0]
    sampled = list(record.clients)
    assert 2 in sampled  # the straggler (6 samples, 3 planned steps, deadline 2) is in S

    # ---- by hand: K local steps of y -= eta_l (grad + c - c_k), grad of mean cross-entropy
    # of identical rows = outer(softmax(W f) - e_y, f)
    c = C0
    y_k, dc_k, steps = {}, {}, {}
    for k in sampled:
        K = -(-SIZES[k] // 2)  # planned steps
        if K > 2:
            if stragglers == "drop":
                continue  # no upload: not in S
            K = 2  # cut at the deadline: the steps actually taken
        f = torch.tensor(PIXELS[k], dtype=torch.float32).div(255.0).double()
        e = torch.zeros(2, dtype=torch.float64)
        e[LABELS[k]] = 1.0
        ck = CK0.get(k, torch.zeros(2, 2, dtype=torch.float64))
        y = x.clone()
        for _ in range(K):
            p = torch.softmax(y @ f, dim=0)
            grad = torch.outer(p - e, f)
            y = y - LR * (grad + c - ck)
        ck_new = ck - c + (x - y) / (K * LR)  # option II
        y_k[k], dc_k[k], steps[k] = y, ck_new - ck, K
    S = list(y_k)
    assert len(S) == (3 if stragglers == "partial" else 2)
    x_new = x + SERVER_LR * sum(y_k[k] - x for k in S) / len(S)
    c_new = c + (len(S) / N) * sum(dc_k[k] for k in S) / len(S)

    torch.testing.assert_close(sim.global_state[KEY], x_new, rtol=0, atol=1e-12)
    state = sim.algorithm.state_dict()
    torch.testing.assert_close(state["c"][KEY], c_new, rtol=0, atol=1e-12)
    for k in range(N):  # reporting clients moved on; the others (unsampled, dropped) did not
        before = CK0.get(k, torch.zeros(2, 2, dtype=torch.float64))
        want = before + dc_k[k] if k in S else before
        got = state["clients"].get(k, torch.zeros(2, 2, dtype=torch.float64))
        got = got[KEY] if isinstance(got, dict) else got
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert {r.client_id: r.num_steps for r in clients.records if r.accepted} == steps

    # ---- bytes: x and c down to every sampled client; y_k and delta c_k up from S
    down = len(payload.encode({KEY: x, MESSAGE + KEY: c}))
    assert record.download_bytes == 3 * down
    up = {k: len(payload.encode({KEY: y_k[k], UPLOAD + KEY: dc_k[k]})) for k in S}
    assert record.upload_bytes == sum(up.values())
    assert {r.client_id: r.upload_bytes for r in clients.records if r.accepted} == up
    fedavg = len(payload.encode({KEY: x}))
    assert down > fedavg and min(up.values()) > fedavg  # the control variates travel


def test_server_control_is_the_mean_of_all_client_controls_under_dropout():
    """c += (|S|/N) mean_S delta c_k keeps c = (1/N) sum_k c_k, |S| the accepted uploads."""
    shards = np.array_split(np.random.default_rng(0).permutation(400), 5)
    sim = Simulation(
        model_fn=tiny_cnn,
        algorithm=build_algorithm("scaffold"),
        train=toy_data(),
        test=toy_data(100, seed=1),
        shards=shards,
        local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4, max_steps=5),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=4, clients_per_round=3, seed=2, dropout=0.4),
        workers=0,
    )
    history = sim.run()
    assert sum(len(r.dropped) for r in history.rounds) > 0  # some sampled clients dropped
    state = sim.algorithm.state_dict()
    for key, c in state["c"].items():
        total = sum(ck[key].double() for ck in state["clients"].values())
        torch.testing.assert_close(c.double(), total / 5, rtol=1e-5, atol=1e-7)
    assert float(sum(c.abs().sum() for c in state["c"].values())) > 0


def test_control_variates_survive_a_checkpoint():
    sim, _ = one_round("sequential", "partial")
    sim.run()
    buf = io.BytesIO()
    torch.save(sim.algorithm.state_dict(), buf)  # as a checkpoint stores it
    other, _ = one_round("sequential", "partial")
    other.algorithm.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    a, b = sim.algorithm.state_dict(), other.algorithm.state_dict()
    assert torch.equal(a["c"][KEY], b["c"][KEY])
    assert sorted(a["clients"]) == sorted(b["clients"])
    for k in a["clients"]:
        assert torch.equal(a["clients"][k][KEY], b["clients"][k][KEY])
    with pytest.raises(ValueError, match="unknown keys"):
        other.algorithm.load_state_dict({**a, "m": {}})


def test_adamw_is_refused_in_one_line():
    algo = build_algorithm("scaffold")
    algo.check(RunSpec(adapter="lora", optimizer="sgd"))  # adapters: c covers what trains
    with pytest.raises(ConfigError) as err:
        algo.check(RunSpec(optimizer="adamw"))
    assert str(err.value) == (
        "scaffold corrects local SGD gradients and reads (x - y_k) / (K eta_l) as their mean "
        "(option II): client.optimizer must be sgd, not adamw"
    )
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="server_lr"):
        build_algorithm("scaffold", server_lr=0)
