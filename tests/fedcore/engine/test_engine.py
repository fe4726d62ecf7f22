"""FedAvg engine properties: equivalence with plain SGD, weights, determinism, bytes."""

from __future__ import annotations

import dataclasses
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.aggregate import weighted_average
from fedcore.algorithms import FedAvg, build_algorithm
from fedcore.algorithms.base import ClientUpdate
from fedcore.client import ImageData, LocalConfig, batch_order
from fedcore.engine import (
    ClientResult,
    FederationConfig,
    Simulation,
    WireBackend,
    derive_seed,
    sample_clients,
)
from fedcore.errors import ConfigError, UnknownNameError
from fedcore.events import Callback
from fedcore.jobs import receive
from fedcore.schedules import LRSchedule
from tests.helpers import make_sim, tiny_cnn, toy_data


def test_single_client_fedavg_equals_plain_sgd():
    """One client holding all data, one round == torch.optim.SGD over the same batch order."""
    local = LocalConfig(local_epochs=2, batch_size=16, momentum=0.9, weight_decay=5e-4)
    sim = make_sim([np.arange(400)], rounds=1, local=local, seed=3)
    init = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run()

    data = toy_data()
    model = tiny_cnn()
    model.load_state_dict(init)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(
        derive_seed(3, 2, 1, 0, 0)
    )  # (seed, client stream, round, client, slot)
    torch.set_num_threads(1)
    for pos in batch_order(400, local, gen):
        x, y = data.batch(pos, generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, sim.global_state[k]), k


def test_single_client_adamw_equals_torch_adamw():
    """optimizer adamw: one client, one round == torch.optim.AdamW over the same batches."""
    local = LocalConfig(local_epochs=2, batch_size=16, weight_decay=0.01, optimizer="adamw")
    sim = make_sim([np.arange(400)], rounds=1, local=local, seed=3)
    init = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run()

    data = toy_data()
    model = tiny_cnn()
    model.load_state_dict(init)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01, foreach=False)
    gen = torch.Generator().manual_seed(derive_seed(3, 2, 1, 0, 0))
    torch.set_num_threads(1)
    for pos in batch_order(400, local, gen):
        x, y = data.batch(pos, generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, sim.global_state[k]), k
    assert any(not torch.equal(init[k], sim.global_state[k]) for k in init)  # it trained


def test_weighted_average_hand_computed():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert out["n"].item() == 5  # counters take the max


def test_fedavg_weights_are_sample_counts():
    ups = [ClientUpdate(0, {}, 10, 1, 0.0, 0), ClientUpdate(1, {}, 30, 3, 0.0, 0)]
    assert FedAvg().aggregation_weights(ups) == [10.0, 30.0]


def test_byte_accounting_matches_serialized_sizes():
    shards = np.array_split(np.arange(400), 4)
    seen = []

    class Spy(Callback):
        def on_client_end(self, record):
            seen.append(record)

    sim = make_sim(shards, rounds=2, m=3, callbacks=[Spy()])
    expected = len(payload.encode(sim.global_state))
    hist = sim.run()
    assert len(seen) == 6
    for rec in seen:  # full model both ways: same keys, shapes and dtypes
        assert rec.download_bytes == expected and rec.upload_bytes == expected
    r1, r2 = hist.rounds
    assert r1.download_bytes == 3 * expected and r1.upload_bytes == 3 * expected
    assert r2.cum_download_bytes == 6 * expected and hist.upload_bytes == 6 * expected


def test_deterministic_across_workers_and_order():
    shards = np.array_split(np.arange(400), 4)
    a = make_sim(shards, rounds=2, m=3, workers=0)
    ha = a.run()
    b = make_sim(shards, rounds=2, m=3, workers=2)
    hb = b.run()
    assert [r.accuracy for r in ha.rounds] == [r.accuracy for r in hb.rounds]
    for k in a.global_state:
        assert torch.equal(a.global_state[k], b.global_state[k]), k


def test_a_client_result_is_the_decoded_upload_and_pickles():
    """The server's side of a client job: the upload decoded, its wire bytes counted, its
    finiteness checked; frozen, and picklable (it may cross a process pool)."""
    state = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    blob = payload.encode(state)
    res = receive((3, blob, 10, 2, 0.25, 0.5, None))
    assert isinstance(res, ClientResult) and res.finite
    assert (res.client_id, res.upload_bytes, res.num_samples, res.num_steps) == (
        3,
        len(blob),
        10,
        2,
    )
    assert (res.train_loss, res.seconds) == (0.25, 0.5)
    assert all(torch.equal(res.upload[k], state[k]) for k in state)
    back = pickle.loads(pickle.dumps(res))
    assert list(back.upload) == list(state) and torch.equal(back.upload["w"], state["w"])
    assert dataclasses.replace(back, upload={}) == dataclasses.replace(res, upload={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.finite = False  # type: ignore[misc]
    update = res.update()
    assert (update.client_id, update.num_samples, update.upload_bytes) == (3, 10, len(blob))
    assert not receive(
        (3, payload.encode({"w": torch.tensor([float("nan")])}), 1, 1, 0.0, 0.0, None)
    ).finite


class ReversedBackend(WireBackend):
    """A backend in one class: the jobs run in this process last to first (as a pool may
    complete them), single-threaded; results are handed back in task order."""

    def __init__(self, work):
        self.work, self.ctx, self.jobs = work, None, 0

    @classmethod
    def create(cls, work, where):
        return cls(work)

    def start(self, global_state):
        self.ctx = self.work.on_device()
        return global_state

    def _map(self, fn_local, fn_worker, jobs, *, what="job"):
        self.jobs += len(jobs)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            done = [fn_local(self.ctx, *job) for job in reversed(jobs)]
        finally:
            torch.set_num_threads(threads)
        return done[::-1]

    def close(self):
        pass


def test_a_new_backend_is_one_class_and_changes_no_number():
    shards = np.array_split(np.arange(400), 4)
    a = make_sim(shards, rounds=2, m=3)
    ha = a.run()
    b = make_sim(shards, rounds=2, m=3)
    b.backend = ReversedBackend(b.backend.work)
    hb = b.run()
    assert b.backend.jobs == 2 * 3 + 2 * 1  # per round: 3 clients, 1 evaluation (100 images)
    assert [r.to_dict() | {"seconds": 0} for r in ha.rounds] == [
        r.to_dict() | {"seconds": 0} for r in hb.rounds
    ]
    for k in a.global_state:
        assert torch.equal(a.global_state[k], b.global_state[k]), k


def test_sampling():
    cfg = FederationConfig(rounds=1, clients_per_round=5, seed=1)
    picks = sample_clients(cfg, 20, 1)
    assert len(set(picks)) == 5 and picks == sample_clients(cfg, 20, 1)
    assert picks != sample_clients(cfg, 20, 2)
    with_repl = FederationConfig(rounds=1, clients_per_round=50, sampling="with_replacement")
    draws = sample_clients(with_repl, 10, 1)
    assert len(draws) == 50 and len(set(draws)) < 50
    assert sample_clients(FederationConfig(rounds=1, clients_per_round=10), 10, 4) == tuple(
        range(10)
    )


def test_lr_schedules():
    assert LRSchedule(kind="step", lr=0.1, milestones=(30,)).at(29) == pytest.approx(0.1)
    assert LRSchedule(kind="step", lr=0.1, milestones=(30,)).at(30) == pytest.approx(0.01)
    assert LRSchedule(kind="exponential", lr=0.01, decay=0.998).at(1) == 0.01
    assert LRSchedule(kind="exponential", lr=0.01, decay=0.998).at(101) == pytest.approx(
        0.01 * 0.998**100
    )


# The exponential schedule of seed 004 §6.1.4
def test_exponential_schedule_t_is_rounds_elapsed():
    """eta_t = eta_0 0.998^t; SGD "starts with an initial learning rate of 0.01": round 1
    trains at eta_0, round r at eta_0 0.998^(r - 1), as ExponentialLR stepped per round."""
    sched = LRSchedule(kind="exponential", lr=0.01)  # decay 0.998 by default (the paper's)
    assert sched.decay == 0.998
    assert sched.at(1) == 0.01
    assert sched.at(2) == pytest.approx(0.01 * 0.998)
    assert sched.at(2000) == pytest.approx(0.01 * 0.998**1999)  # the paper's round cap
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.01)
    torch_sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.998)
    for r in range(1, 6):
        assert sched.at(r) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        opt.step()
        torch_sched.step()


def test_nan_update_rejected_and_model_kept():
    class Poison(FedAvg):
        def client_objective(self, global_state, client):
            return lambda logits, y, params: logits.sum() * float("nan")

    sim = make_sim([np.arange(200), np.arange(200, 400)], rounds=1, algorithm=Poison())
    before = {k: v.clone() for k, v in sim.global_state.items()}
    hist = sim.run()
    assert hist.rounds[0].rejected == 2
    assert all(torch.equal(before[k], sim.global_state[k]) for k in before)


def test_algorithm_registry_errors():
    with pytest.raises(UnknownNameError, match="fedavg"):
        build_algorithm("fedsgd")
    with pytest.raises(ConfigError, match="mu"):
        build_algorithm("fedavg", mu=0.1)


def test_stop_after_trains_the_first_rounds_of_the_run_exactly():
    """federation.stop_after: rounds 1..k of a run configured for more rounds, the same
    numbers as those rounds of the whole run (the lr schedule still reads ``rounds``)."""
    shards = [np.arange(0, 100), np.arange(100, 200)]
    whole = make_sim(shards, rounds=4, eval_every=3).run()
    part = make_sim(shards, rounds=4, eval_every=3, stop_after=2).run()
    assert whole.stop_reason == "rounds" and part.stop_reason == "stop_after"
    assert [r.train_loss for r in part.rounds] == [r.train_loss for r in whole.rounds[:2]]
    assert [r.lr for r in part.rounds] == [r.lr for r in whole.rounds[:2]]
    assert part.rounds[-1].accuracy is not None  # the last round is evaluated
    assert make_sim(shards, rounds=2, stop_after=2).run().stop_reason == "rounds"
    with pytest.raises(ConfigError, match=r"federation.stop_after must be in \[1, rounds=2\]"):
        FederationConfig(rounds=2, clients_per_round=1, stop_after=3)


def test_cuda_determinism_is_scoped_to_the_run(monkeypatch):
    """The CUDA settings hold for a run only and come back after it (a CPU run later in the
    process is unaffected); cuBLAS's workspace is set before its first call, a user's kept."""
    from fedcore.device import CUBLAS_WORKSPACE, deterministic

    det = torch.utils.deterministic
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory,
              torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    with deterministic("cpu"):
        assert not torch.are_deterministic_algorithms_enabled()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with deterministic("cuda:0"):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not det.fill_uninitialized_memory
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    after = (torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory,
             torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    assert after == before
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with deterministic("cuda"):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert not torch.are_deterministic_algorithms_enabled()


def test_every_command_sets_the_cublas_workspace_before_cuda_without_importing_torch():
    import subprocess
    import sys

    from fedcore.device import CUBLAS_WORKSPACE

    code = (
        "import os, sys\n"
        "os.environ.pop('CUBLAS_WORKSPACE_CONFIG', None)\n"
        "from flows.cli.environment import offline_defaults\n"
        "offline_defaults()\n"
        "print(os.environ['CUBLAS_WORKSPACE_CONFIG'], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [CUBLAS_WORKSPACE, "False"]


def test_a_cuda_device_that_is_not_there_is_one_line(monkeypatch):
    from fedcore.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:3"):
        with pytest.raises(ConfigError, match=f"runtime.device: '{name}' requested but no CUDA"):
            resolve_device(name)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1" and resolve_device("cuda") == "cuda"
    with pytest.raises(ConfigError, match=r"'cuda:3' requested but this machine has 2 CUDA"):
        resolve_device("cuda:3")
    with pytest.raises(ConfigError, match="not one of auto, cpu, cuda, cuda:N"):
        resolve_device("gpu")


def test_the_verdict_window_measures_the_whole_test_split_the_curve_its_rows():
    """federation.whole_test_last k: the last k planned evaluations measure every test row,
    the others only ``test_rows``; those equal a run on the rows alone, number for number."""
    shards = [np.arange(0, 100), np.arange(100, 200)]
    whole_test = toy_data(100, seed=1)
    rows = np.arange(0, 100, 3)
    alone = ImageData(whole_test.images[rows], whole_test.labels[rows], (0.5,), (0.25,))

    def sim(test, test_rows, k):
        return Simulation(
            model_fn=tiny_cnn,
            algorithm=FedAvg(),
            train=toy_data(),
            test=test,
            test_rows=test_rows,
            shards=shards,
            local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
            lr_schedule=LRSchedule(lr=0.05),
            federation=FederationConfig(
                rounds=5, clients_per_round=2, eval_every=2, whole_test_last=k
            ),
        )

    assert FederationConfig(rounds=5, clients_per_round=1, eval_every=2).eval_rounds() == [2, 4, 5]
    mixed = sim(whole_test, rows, 2).run().rounds
    subset = sim(alone, None, 0).run().rounds
    every = sim(whole_test, None, 0).run().rounds
    acc = lambda rs: [r.accuracy for r in rs]  # noqa: E731
    assert acc(mixed)[:2] == acc(subset)[:2]  # rounds 1-2: the rows (round 2) or none
    assert acc(mixed)[3:] == acc(every)[3:]  # rounds 4 and 5: every row
    assert acc(mixed)[3] != acc(subset)[3]  # ... which differ from the rows alone
    assert [r.train_loss for r in mixed] == [r.train_loss for r in every]  # training untouched
    with pytest.raises(ConfigError, match="federation.whole_test_last must be >= 0"):
        FederationConfig(rounds=2, clients_per_round=1, whole_test_last=-1)


class InfServer(FedAvg):
    def server_update(self, global_state, aggregated, round_):
        out = dict(aggregated)
        out["4.bias"] = torch.full_like(out["4.bias"], float("inf"))
        return out


def test_nonfinite_server_update_keeps_the_model_and_sets_the_flag():
    shards = np.array_split(np.arange(400), 2)
    sim = make_sim(shards, rounds=2, algorithm=InfServer())
    before = {k: v.clone() for k, v in sim.global_state.items()}
    hist = sim.run()
    for r in hist.rounds:
        assert r.rejected == 0  # the clients' updates were fine
        assert r.extra["nonfinite_global_rejected"] == 1.0
        assert np.isfinite(r.test_loss)
    for k, v in before.items():
        assert torch.equal(v, sim.global_state[k]), k
    ok = make_sim(shards, rounds=1).run()
    assert "nonfinite_global_rejected" not in ok.rounds[0].extra
