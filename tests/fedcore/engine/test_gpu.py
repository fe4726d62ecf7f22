"""CUDA against CPU (issue 12): the same seeded federation on both devices ends at the same
model and accuracies, within float tolerance (cuDNN picks other kernels, summation orders
differ). Marked ``gpu``: skipped where no CUDA device is present (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import CohortBackend, FederationConfig, Simulation
from fedcore.events import Callback
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


class _OnDevice(Callback):
    """Records where the global model is while the rounds run (device-resident cohort)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim, self.devices = sim, set()

    def on_round_end(self, record) -> None:
        self.devices |= {v.device.type for v in self.sim.global_state.values()}


def cohort_on(device: str, algorithm: str, engine: str, noise: bool = True):
    sim, where = cohort_on_unrun(device, algorithm, engine, noise)
    return sim, sim.run(), where


def cohort_on_unrun(device: str, algorithm: str, engine: str, noise: bool = True):
    sim = Simulation(
        model_fn=tiny_layered,
        algorithm=build_algorithm(algorithm),
        train=toy_data(400),
        test=toy_data(200, seed=1),
        shards=[np.arange(0, 30), np.arange(30, 150), np.arange(150, 400)],  # ragged
        noise_var=[0.0, 0.01, 0.02] if noise else None,  # noise: batches client by client
        local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(kind="exponential", lr=0.05, decay=0.9),
        federation=FederationConfig(rounds=3, clients_per_round=3, seed=7),
        workers=0,
        device=device,
        engine=engine,
    )
    where = _OnDevice(sim)
    sim.callbacks.append(where)
    return sim, where


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("algorithm", "noise"),
    [("fedavg", True), ("fedprox", True), ("fednova", True), ("fedavg", False)],
)
def test_cuda_cohort_matches_cpu_sequential(algorithm, noise):
    """The cohort engine on CUDA (data, global model and aggregation on the device) ends
    where the sequential reference on the CPU does; bytes are identical. Without noise a
    step's batches are one gather on the device."""
    assert torch.cuda.is_available()
    cpu, h_cpu, _ = cohort_on("cpu", algorithm, "sequential", noise)
    gpu, h_gpu, where = cohort_on("cuda", algorithm, "cohort", noise)
    assert where.devices == {"cuda"}  # the global model stayed on the device all run
    assert isinstance(gpu.backend, CohortBackend)
    for attr in ("clients", "download_bytes", "upload_bytes"):
        assert [getattr(r, attr) for r in h_cpu.rounds] == [getattr(r, attr) for r in h_gpu.rounds]
    for k, v in cpu.global_state.items():
        g = gpu.global_state[k]
        assert g.device.type == "cpu"  # handed back on the host after the run
        if v.is_floating_point():
            assert torch.allclose(v, g, rtol=1e-3, atol=1e-4), k
        else:
            assert torch.equal(v, g), k
    for a, b in zip(h_cpu.rounds, h_gpu.rounds, strict=True):
        assert a.accuracy == pytest.approx(b.accuracy, abs=0.02)
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)


@pytest.mark.gpu
def test_cuda_cohort_is_deterministic():
    _, a, _ = cohort_on("cuda", "fedavg", "cohort")
    _, b, _ = cohort_on("cuda", "fedavg", "cohort")
    assert [r.to_dict() | {"seconds": 0} for r in a.rounds] == [
        r.to_dict() | {"seconds": 0} for r in b.rounds
    ]


@pytest.mark.gpu
def test_cuda_cohort_fedadam_resumes_byte_identical():
    """A checkpoint loads FedAdam's moments on the CPU; the cohort engine keeps the model on
    the GPU: the resumed run moves them there and ends where the uninterrupted one does."""
    import io

    from tests.helpers import Crash, CrashAfter

    def sim():
        return cohort_on_unrun("cuda", "fedadam", "cohort")[0]

    ref = sim()
    want = ref.run()
    first = sim()
    crash = CrashAfter(first, 2)
    first.callbacks.append(crash)
    with pytest.raises(Crash):
        first.run()
    again = sim()
    state = torch.load(io.BytesIO(crash.saved), weights_only=True)
    assert all(v.device.type == "cpu" for v in state["algorithm"]["m"].values())
    again.load_state_dict(state)
    got = again.run()
    assert [r.to_dict() | {"seconds": 0} for r in got.rounds] == [
        r.to_dict() | {"seconds": 0} for r in want.rounds
    ]
    for k, v in ref.global_state.items():
        assert torch.equal(v.cpu(), again.global_state[k].cpu()), k
