"""CUDA against CPU (issue 12): the same seeded federation on both devices ends at the same
model and accuracies, within float tolerance (cuDNN picks other kernels, summation orders
differ). Marked ``gpu``: skipped where no CUDA device is present (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.schedules import LRSchedule
from tests.helpers import tiny_layered, toy_data


def run_on(device: str, algorithm: str):
    sim = Simulation(
        model_fn=tiny_layered,
        algorithm=build_algorithm(algorithm),
        train=toy_data(400),
        test=toy_data(200, seed=1),
        shards=np.array_split(np.arange(400), 4),
        noise_var=[0.0, 0.01, 0.02, 0.03],  # the noise is drawn on the CPU either way
        local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(kind="exponential", lr=0.05, decay=0.9),
        federation=FederationConfig(rounds=3, clients_per_round=3, seed=7),
        workers=0,
        device=device,
    )
    return sim, sim.run()


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["fedavg", "fednova"])
def test_cuda_matches_cpu(algorithm):
    assert torch.cuda.is_available()
    cpu, h_cpu = run_on("cpu", algorithm)
    gpu, h_gpu = run_on("cuda", algorithm)
    assert [r.clients for r in h_cpu.rounds] == [r.clients for r in h_gpu.rounds]
    assert [r.download_bytes for r in h_cpu.rounds] == [r.download_bytes for r in h_gpu.rounds]
    assert [r.upload_bytes for r in h_cpu.rounds] == [r.upload_bytes for r in h_gpu.rounds]
    for k, v in cpu.global_state.items():
        g = gpu.global_state[k]
        assert g.device.type == "cpu"  # the server state lives on the CPU either way
        if v.is_floating_point():
            assert torch.allclose(v, g, rtol=1e-3, atol=1e-4), k
        else:
            assert torch.equal(v, g), k
    for a, b in zip(h_cpu.rounds, h_gpu.rounds, strict=True):
        assert a.accuracy == pytest.approx(b.accuracy, abs=0.02)  # <= 4 of 200 test images
        assert a.test_loss == pytest.approx(b.test_loss, rel=1e-3)
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)
