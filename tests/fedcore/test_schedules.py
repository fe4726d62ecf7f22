"""Learning-rate schedules (fedcore/schedules.py), and the engine training each round at that
round's rate; expected values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcore.algorithms import FedAvg
from fedcore.client import LocalConfig, batch_order
from fedcore.engine import FederationConfig, Simulation, derive_seed
from fedcore.events import Callback
from fedcore.schedules import LRSchedule
from tests.helpers import tiny_cnn, toy_data


def test_step_schedule_two_milestones():
    s = LRSchedule(kind="step", lr=0.1, gamma=0.1, milestones=(30, 60))
    got = [s.at(r) for r in (1, 29, 30, 59, 60, 61, 200)]
    assert got == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.001])
    half = LRSchedule(kind="step", lr=1.0, gamma=0.5, milestones=(2, 3, 5))
    assert [half.at(r) for r in range(1, 7)] == pytest.approx([1, 0.5, 0.25, 0.25, 0.125, 0.125])


def test_engine_uses_this_round_lr():
    """Exponential schedule, lr 0.1, decay 0.5: rounds 1..3 train at 0.1, 0.05, 0.025.

    One client holding all the data: each round is torch.optim.SGD at that round's lr from
    the previous round's model (fresh momentum each round), over the engine's batch order."""
    local = LocalConfig(batch_size=50, momentum=0.9, weight_decay=5e-4)
    data, test = toy_data(), toy_data(100, seed=1)
    sim = Simulation(
        model_fn=tiny_cnn,
        algorithm=FedAvg(),
        train=data,
        test=test,
        shards=[np.arange(400)],
        local=local,
        lr_schedule=LRSchedule(kind="exponential", lr=0.1, decay=0.5),
        federation=FederationConfig(rounds=3, clients_per_round=1, seed=5, eval_every=0),
        workers=0,
    )
    init = {k: v.clone() for k, v in sim.global_state.items()}
    starts = []

    class Spy(Callback):
        def on_round_start(self, r, clients, lr):
            starts.append(lr)

    sim.callbacks.append(Spy())
    hist = sim.run()
    lrs = [0.1, 0.05, 0.025]
    assert [r.lr for r in hist.rounds] == pytest.approx(lrs)
    assert starts == pytest.approx(lrs)

    model = tiny_cnn()
    model.load_state_dict(init)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r, lr in enumerate(lrs, start=1):
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
            gen = torch.Generator().manual_seed(derive_seed(5, 2, r, 0, 0))
            for pos in batch_order(400, local, gen):
                x, y = data.batch(pos, generator=gen)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    finally:
        torch.set_num_threads(threads)
    for k, v in model.state_dict().items():
        assert torch.allclose(v.double(), sim.global_state[k].double(), rtol=0, atol=1e-6), k
