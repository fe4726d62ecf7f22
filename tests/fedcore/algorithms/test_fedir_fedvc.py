"""FedIR and FedVC: what a client trains on, and how it weighs it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcore.algorithms import FedAvg
from fedcore.algorithms.fedir import FedIR, importance_weights
from fedcore.algorithms.fedvc import FedVC
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig
from fedcore.events import Callback
from fedcore.partition import iid
from tests.helpers import make_sim, toy_data


class Clients(Callback):
    def __init__(self):
        self.records = []

    def on_client_end(self, record):
        self.records.append(record)


# ---- FedIR ----------------------------------------------------------------------------------


def test_importance_weights_hand_computed():
    p_y = torch.tensor([0.5, 0.3, 0.2])
    w = importance_weights(p_y, torch.tensor([0, 0, 0, 1]))  # q = (3/4, 1/4, 0)
    assert w.tolist() == pytest.approx([0.5 / 0.75, 0.3 / 0.25, 0.0])


def test_fedir_weights_are_near_one_on_an_iid_partition():
    labels = toy_data().labels.numpy()
    p_y = torch.tensor(np.bincount(labels) / len(labels), dtype=torch.float32)
    part = iid(labels, num_clients=4, seed=0)
    for ix in part.client_indices:
        w = importance_weights(p_y, torch.as_tensor(labels[ix]))
        assert w.tolist() == pytest.approx([1.0, 1.0], abs=0.15)


def test_fedir_with_q_equal_p_is_fedavg():
    """One client holding all the data: q_k = p, every weight is 1."""
    ref = make_sim([np.arange(400)], rounds=2)
    ref.run()
    sim = make_sim([np.arange(400)], rounds=2, algorithm=FedIR())
    sim.run()
    for k, v in ref.global_state.items():
        assert torch.allclose(v.double(), sim.global_state[k].double(), atol=1e-5), k


def test_fedir_on_iid_shards_tracks_fedavg_and_pays_for_p_y():
    labels = toy_data().labels.numpy()
    shards = iid(labels, num_clients=4, seed=0).client_indices
    spies = Clients(), Clients()
    ref = make_sim(shards, rounds=2, callbacks=[spies[0]])
    h_ref = ref.run()
    sim = make_sim(shards, rounds=2, algorithm=FedIR(), callbacks=[spies[1]])
    h = sim.run()
    for k, v in ref.global_state.items():
        if v.is_floating_point():
            rel = float((v - sim.global_state[k]).norm() / v.norm().clamp_min(1e-12))
            assert rel < 0.1, k
    assert abs(h.final_accuracy - h_ref.final_accuracy) <= 0.05
    pairs = zip(spies[0].records, spies[1].records, strict=True)
    extra = [b.download_bytes - a.download_bytes for a, b in pairs]
    assert all(0 < e < 1024 for e in extra)  # p(y): two floats plus their container entry
    assert [a.upload_bytes for a in spies[0].records] == [b.upload_bytes for b in spies[1].records]


# ---- FedVC ----------------------------------------------------------------------------------


@pytest.mark.parametrize("epochs", [1, 2])
def test_fedvc_trains_exactly_n_vc_samples(epochs):
    shards = [np.arange(0, 30), np.arange(30, 130), np.arange(130, 400)]  # 30 < N_VC < 100
    spy = Clients()
    local = LocalConfig(local_epochs=epochs, batch_size=16)
    sim = make_sim(shards, rounds=2, algorithm=FedVC(n_vc=40), callbacks=[spy], local=local)
    sim.run()
    assert len(spy.records) == 6
    for rec in spy.records:
        assert rec.num_samples == 40
        assert rec.num_steps == epochs * math.ceil(40 / 16)


def test_fedvc_draws_without_replacement_when_it_can():
    algo, shard = FedVC(n_vc=40), np.arange(100, 200)
    ix = algo.client_indices(shard, 3, 1, 0, seed=7)
    assert len(ix) == 40 and len(set(ix.tolist())) == 40 and set(ix) <= set(shard)
    assert np.array_equal(ix, algo.client_indices(shard, 3, 1, 0, seed=7))  # seeded
    assert not np.array_equal(ix, algo.client_indices(shard, 4, 1, 0, seed=7))  # per round
    small = algo.client_indices(np.arange(5), 3, 1, 0, seed=7)
    assert len(small) == 40 and set(small) == set(range(5))  # with replacement


@pytest.mark.parametrize("sampling", ["without_replacement", "with_replacement"])
def test_fedvc_selects_clients_in_proportion_to_size(sampling):
    sizes = [10, 20, 30, 40, 0]
    cfg = FederationConfig(rounds=1, clients_per_round=1, sampling=sampling, seed=3)
    rounds = 4000
    picks = [FedVC().select_clients(cfg, sizes, r)[0] for r in range(1, rounds + 1)]
    observed = np.bincount(picks, minlength=5)
    assert observed[4] == 0  # an empty client is never selected
    expected = rounds * np.array(sizes[:4]) / 100
    chi2 = float(((observed[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001
    uniform = [FedAvg().select_clients(cfg, sizes, r)[0] for r in range(1, 401)]
    assert abs(np.bincount(uniform, minlength=5)[0] / 400 - 0.2) < 0.06  # FedAvg: 1/5 each


def test_fedvc_rounds_select_distinct_clients_without_replacement():
    cfg = FederationConfig(rounds=1, clients_per_round=3, seed=0)
    picks = FedVC().select_clients(cfg, [50, 1, 1, 1, 50], 1)
    assert len(set(picks)) == 3 and list(picks) == sorted(picks)
