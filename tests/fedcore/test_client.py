"""A client's data (fedcore/client.py): Gaussian feature noise (seed 000 §IV: client i of N,
variance sigma * i / N) in the batch and in the engine's client batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.algorithms import FedAvg
from fedcore.client import ImageData, LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.partition import make_partition
from fedcore.schedules import LRSchedule
from tests.helpers import tiny_cnn, toy_data


def _clean_and_noisy(data, idx, var, seed):
    clean, _ = data.batch(idx)
    noisy, _ = data.batch(idx, noise_var=var, generator=torch.Generator().manual_seed(seed))
    return clean, noisy


def test_noisy_batch_has_variance_sigma_i_over_n():
    labels = np.tile(np.arange(2), 200)
    part = make_partition("gaussian_noise", labels, num_clients=4, seed=0, sigma=1.0)
    assert part.noise_var == pytest.approx((0.25, 0.5, 0.75, 1.0))  # C_1..C_N: i from 1
    data = toy_data(400, size=12)
    for i, var in enumerate(part.noise_var):
        idx = torch.as_tensor(part.client_indices[i], dtype=torch.int64)
        clean, noisy = _clean_and_noisy(data, idx, var, seed=i)
        diff = (noisy - clean).flatten()  # 100 images x 144 pixels per client
        if var == 0.0:
            assert torch.equal(noisy, clean)
        else:
            # std of the sample variance of 14,400 normals: var * sqrt(2 / n) ~ 1.2% of var;
            # a std of var would give var^2 (0.0625, 0.25, 0.5625, 1.0): 25 to 75% away for
            # the first three clients.
            assert float(diff.var()) == pytest.approx(var, rel=0.04), i
            assert abs(float(diff.mean())) < 0.03


def test_noise_reaches_each_client_batch_in_the_engine():
    """Through the Simulation: every batch client i trains on carries noise of variance
    sigma * i / N (measured on the batch itself, against its clean version)."""

    class Measured(ImageData):
        def __init__(self, base):
            super().__init__(base.images, base.labels, (0.5,), (0.25,))
            self.calls = []

        def batch(self, idx, *, noise_var=0.0, generator=None, device="cpu"):
            x, y = super().batch(idx, noise_var=noise_var, generator=generator, device=device)
            clean, _ = super().batch(idx, device=device)
            self.calls.append((idx.clone(), float((x - clean).var()) if len(idx) > 1 else 0.0))
            return x, y

    data = Measured(toy_data(400))
    labels = data.labels.numpy()
    part = make_partition("gaussian_noise", labels, num_clients=4, seed=0, sigma=2.0)
    sim = Simulation(
        model_fn=tiny_cnn,
        algorithm=FedAvg(),
        train=data,
        test=toy_data(50, seed=1),
        shards=part.client_indices,
        noise_var=part.noise_var,
        local=LocalConfig(batch_size=100),
        lr_schedule=LRSchedule(lr=0.01),
        federation=FederationConfig(rounds=1, clients_per_round=4, eval_every=0),
        workers=0,  # in this process: the measured batches are this object's
    )
    sim.run()
    owner = {int(s): c for c, shard in enumerate(part.client_indices) for s in shard}
    per_client: dict[int, list[float]] = {}
    for idx, var in data.calls:
        (client,) = {owner[int(j)] for j in idx}
        per_client.setdefault(client, []).append(var)
    assert sorted(per_client) == [0, 1, 2, 3]
    for c, vars_ in per_client.items():
        expected = 2.0 * (c + 1) / 4  # C_1..C_4: 0.5, 1.0, 1.5, 2.0 (as a std: 0.25 .. 4.0)
        assert np.mean(vars_) == pytest.approx(expected, rel=0.05, abs=1e-9), c
