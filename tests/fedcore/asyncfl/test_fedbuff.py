"""FedBuff on the virtual clock: staleness weights and the buffered step by hand, the event
order by hand, FedAvg in the degenerate setting, availability, reruns and resumes."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms.base import ClientUpdate, FederatedAlgorithm
from fedcore.asyncfl.buffer import buffered_step, staleness_weight
from fedcore.asyncfl.clock import DeviceClock
from fedcore.asyncfl.config import AsyncConfig, parse_async, parse_devices
from fedcore.asyncfl.events import Entry, EventQueue, Job, JobPlan, JobResult
from fedcore.asyncfl.fedbuff import FedBuffServer
from fedcore.payload import StateDict
from tests.fedcore.asyncfl.support import THREE


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread (two threads on busy cores cost 20 ms an op)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- pure functions by hand --------------------------------------------------------------


def test_staleness_weights_by_hand() -> None:
    assert [staleness_weight("constant", t) for t in (0, 1, 7)] == [1.0, 1.0, 1.0]
    assert [staleness_weight("inverse_sqrt", t) for t in (0, 3, 8)] == [1.0, 0.5, 1 / 3]
    assert staleness_weight("polynomial", 3, exponent=1.0) == 0.25
    assert staleness_weight("polynomial", 7, exponent=2 / 3) == pytest.approx(0.25, rel=1e-15)
    assert staleness_weight("polynomial", 5, exponent=0.0) == 1.0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_weight("constant", -1)


def entry(client: int, job: int, base: int, x: list[float], n: int) -> Entry:
    update = {"w": torch.tensor(x, dtype=torch.float64), "count": torch.tensor(job)}
    return Entry(0.0, Job(job, client, base, 0.0), JobResult(update, n, 0, 0))


def test_buffered_step_by_hand() -> None:
    # model version 3 holds w = [1, 2]; version 1 held [0, 0]; version 2 held [1, 1]
    w = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "count": torch.tensor(4)}
    bases = {
        1: {"w": torch.zeros(2, dtype=torch.float64)},
        2: {"w": torch.ones(2, dtype=torch.float64)},
    }
    buffer = [
        entry(0, 10, 3, [2.0, 2.0], 30),  # staleness 0, delta [1, 0]
        entry(1, 11, 1, [4.0, 0.0], 10),  # staleness 2, delta [4, 0]
        entry(2, 12, 2, [1.0, 3.0], 60),  # staleness 1, delta [0, 2]
    ]
    cfg = AsyncConfig(concurrency=3, buffer=3, staleness="polynomial", exponent=1.0, server_lr=0.5)
    new, weights = buffered_step(w, 3, bases, buffer, cfg)
    # p = [0.3, 0.1, 0.6]; s = [1, 1/3, 1/2]; w + 0.5 * sum p s delta
    p_s = [0.3, 0.1 / 3, 0.3]
    assert weights == pytest.approx(p_s)
    expected = [1.0 + 0.5 * (0.3 * 1.0 + 0.1 / 3 * 4.0), 2.0 + 0.5 * (0.3 * 2.0)]
    assert new["w"].tolist() == pytest.approx(expected, rel=0, abs=1e-15)
    assert new["count"].item() == 12  # counters: the maximum
    # uniform weighting: p = 1/3 each; constant staleness, lr 1: the mean delta
    cfg = AsyncConfig(concurrency=3, buffer=3, staleness="constant", weighting="uniform")
    new, weights = buffered_step(w, 3, bases, buffer, cfg)
    assert weights == pytest.approx([1 / 3] * 3)
    assert new["w"].tolist() == pytest.approx([1 + 5 / 3, 2 + 2 / 3], rel=0, abs=1e-15)
    # updates of other keys than each other's or the model's
    odd = entry(3, 13, 3, [0.0, 0.0], 1)
    for bad in ({"v": odd.trained.update["w"]}, {"w": odd.trained.update["w"]}):
        with pytest.raises(ValueError, match="the same keys of the model"):
            buffered_step(
                w, 3, bases, [*buffer, replace(odd, result=odd.trained._replace(update=bad))], cfg
            )


def test_tie_order_is_seeded_and_independent_of_insertion() -> None:
    entries = [
        Entry(5.0, Job(j, c, 0, 0.0), JobResult({}, 1, 0, 0)) for j, c in enumerate([4, 1, 3, 0, 2])
    ] + [Entry(2.0, Job(9, 7, 0, 0.0), JobResult({}, 1, 0, 0))]

    def order(seed: int, items: list[Entry]) -> list[list[int]]:
        q = EventQueue(seed)
        for e in items:
            q.push(e)
        return [[e.job.job_id for e in q.pop_at(t)] for t in (2.0, 5.0)]

    first = order(0, entries)
    assert first[0] == [9] and sorted(first[1]) == [0, 1, 2, 3, 4]
    for perm in (
        entries[::-1],
        entries[2:] + entries[:2],
        sorted(entries, key=lambda e: e.job.client_id),
    ):
        assert order(0, perm) == first
    assert len({tuple(order(s, entries)[1]) for s in range(6)}) > 1  # the seed decides ties


# ---- the server, by hand and in the degenerate setting -------------------------------------


def scalar_train(log: list[tuple[int, int]]) -> Callable[[int, int, StateDict], JobResult]:
    """Client c moves the model by [1, 2, 4][c] and trained on WORK[c] samples."""

    def train(client: int, base_version: int, base: StateDict) -> JobResult:
        log.append((client, base_version))
        x = {"w": base["w"] + [1.0, 2.0, 4.0][client]}
        return JobResult(x, [64, 32, 48][client], 2**19, 2**20)

    return train


def test_event_order_by_hand_on_three_clients() -> None:
    # durations 3.25, 2.375, 7.3125 s (test_clock); K = 3, B = 2, 1 / sqrt(1 + tau)
    clock = DeviceClock(parse_devices(THREE, 3), 3, seed=0)
    server = FedBuffServer(
        AsyncConfig(concurrency=3, buffer=2),
        clock,
        {"w": torch.zeros(1, dtype=torch.float64)},
        seed=0,
    )
    log: list[tuple[int, int]] = []
    steps = server.run(scalar_train(log), version=2)
    # t=0: all three start from v0. 2.375: c1 arrives, restarts from v0 (arrives 4.75).
    # 3.25: c0 arrives -> v1 = (64 * 1 + 32 * 2) / 96; c0 restarts from v1 (arrives 6.5).
    # 4.75: c1 (tau 0) arrives, restarts from v1 (7.125). 6.5: c0 arrives -> v2, restarts.
    assert log == [(0, 0), (1, 0), (2, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert [(a.sim_time, a.clients, a.staleness, a.arrivals) for a in steps] == [
        (3.25, (0, 1), (0, 0), (1, 0)),
        (6.5, (0, 1), (0, 1), (3, 4)),
    ]
    v1 = (64 * 1 + 32 * 2) / 96
    # v2: c0's delta 1 (from v1, tau 0), c1's delta 2 (from v0, tau 1: weight 1/sqrt(2))
    v2 = v1 + (64 / 96) * 1.0 + (32 / 96) / math.sqrt(2) * 2.0
    assert server.global_state["w"].item() == pytest.approx(v2, rel=1e-15)
    assert (steps[1].cum_download_bytes, steps[1].cum_upload_bytes) == (6 * 2**20, 4 * 2**19)
    assert steps[1].weights == pytest.approx((64 / 96, 32 / 96 / math.sqrt(2)), rel=1e-15)
    assert server.bases.keys() == {0, 1}  # c2's job (v0) and c1's (v1) are still pending


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)  # float statistics and an integer counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


def sgd_train(
    log: list[tuple[int, int, int]] | None = None,
) -> Callable[[int, int, StateDict], JobResult]:
    """Real local SGD (3 steps) of a small model on client c's own data (5 + c samples)."""
    model = Net()

    def train(client: int, base_version: int, base: StateDict) -> JobResult:
        if log is not None:
            log.append((client, base_version, len(log)))
        g = torch.Generator().manual_seed(1000 + client)
        n = 5 + client
        x, y = torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)
        model.load_state_dict(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return JobResult(
            state, n, payload.encoded_size(state), payload.encoded_size(base), 3, loss.item()
        )

    return train


def initial() -> StateDict:
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in Net().state_dict().items()}


def test_k_equals_b_with_equal_speeds_is_fedavg_exactly() -> None:
    n = 8
    devices = {"speed": {"value": 0.5}, "download_bw": {"value": 1e6}, "upload_bw": {"value": 1e6}}
    clock = DeviceClock(parse_devices(devices, n), n, seed=5)
    cfg = parse_async({"concurrency": 4, "buffer": 4, "staleness": "constant", "server_lr": 1.0}, n)
    start = initial()
    server = FedBuffServer(cfg, clock, start, seed=5)
    train = sgd_train()
    steps = server.run(train, version=3)
    fedavg, w = FederatedAlgorithm(), start
    for step in steps:
        assert step.staleness == (0,) * 4 and list(step.clients) == sorted(step.clients)
        updates = []
        for c in step.clients:  # FedAvg's round over the same clients, in sampling order
            res = train(c, 0, w)
            updates.append(ClientUpdate(c, res.update, res.num_samples, 3, 0.0, res.up_bytes))
        w = {**w, **fedavg.server_update(w, fedavg.aggregate(w, updates), 1)}
    assert len({s.clients for s in steps}) > 1  # the cohorts differ: a seeded draw each time
    assert all(torch.equal(server.global_state[k], w[k]) for k in w)
    assert payload.encode(server.global_state) == payload.encode(w)


# ---- heterogeneous runs: availability, reruns, resumes -------------------------------------

HETERO = {
    "speed": {"dist": "lognormal", "median": 0.2, "spread": 10.0},
    "download_bw": {"dist": "uniform", "low": 2e4, "high": 1e5},
    "upload_bw": {"dist": "uniform", "low": 1e4, "high": 5e4},
    "download_latency_s": {"value": 0.05},
    "upload_latency_s": {"value": 0.05},
    "availability": {"process": "onoff", "mean_on_s": 20.0, "mean_off_s": 5.0},
}
N = 10
CFG = {"concurrency": 4, "buffer": 2, "staleness": "inverse_sqrt", "server_lr": 0.8}


def hetero_server(seed: int = 11, devices: dict | None = None) -> FedBuffServer:
    clock = DeviceClock(parse_devices(devices or HETERO, N), N, seed=seed)
    return FedBuffServer(parse_async(CFG, N), clock, initial(), seed=seed)


def test_availability_is_honoured() -> None:
    # client 0 is never online; the others have windows of a 60 s day, some shifted
    windows: list[list[list[int]]] = [[]] + [[[0, 20]], [[10, 40]], [[30, 60]]] * 3
    devices = {
        **HETERO,
        "availability": {"process": "trace", "per_client": windows, "period_s": 60},
    }
    server = hetero_server(devices=devices)
    log: list[tuple[int, int, int]] = []
    train = sgd_train(log)
    jobs: dict[int, tuple[int, float, float]] = {}  # job: (client, dispatched at, arrives at)

    def watch(s: FedBuffServer) -> None:
        jobs.update(
            {
                e.job.job_id: (e.job.client_id, e.job.dispatched_at, e.time)
                for e in s.queue.entries()
            }
        )

    server.run(train, version=8, on_instant=watch)
    assert len(jobs) > 10 and all(server.clock.online(c, t) for c, t, _ in jobs.values())
    assert 0 not in {c for c, _, _ in log}
    # the on/off process, online 1 / 11 of the time: every job goes to a client online at its
    # dispatch time, and the server waited for one to come online (a dispatch at no arrival)
    rare = {"process": "onoff", "mean_on_s": 3.0, "mean_off_s": 30.0}
    server, jobs = hetero_server(devices={**HETERO, "availability": rare}), {}
    server.run(train, version=8, on_instant=watch)
    assert len(jobs) > 10 and all(server.clock.online(c, t) for c, t, _ in jobs.values())
    assert {t for _, t, _ in jobs.values()} - {t for _, _, t in jobs.values()} - {0.0}


def test_a_non_finite_upload_is_rejected_and_frees_its_slot() -> None:
    clock = DeviceClock(parse_devices(THREE, 3), 3, seed=0)
    zero = {"w": torch.zeros(1, dtype=torch.float64)}
    server = FedBuffServer(AsyncConfig(concurrency=3, buffer=2), clock, zero, seed=0)
    good = scalar_train([])

    def train(client: int, base_version: int, base: StateDict) -> JobResult:
        res = good(client, base_version, base)
        return res._replace(finite=False) if client == 1 and base_version == 0 else res

    steps = server.run(train, version=1)
    # 2.375: c1's upload rejected, c1 restarts (4.75); 3.25: c0 accepted, restarts (6.5);
    # 4.75: c1 rejected again; 6.5: c0's second upload fills the buffer (c2 arrives at 7.3125)
    assert (steps[0].rejected, steps[0].clients, steps[0].jobs) == (2, (0, 0), (0, 4))
    assert (steps[0].sim_time, steps[0].arrivals) == (6.5, (1, 0, 3, 4))


def test_rerun_is_identical_and_resume_mid_buffer_is_identical() -> None:
    log_a: list[tuple[int, int, int]] = []
    a = hetero_server()
    steps_a = a.run(sgd_train(log_a), version=6)
    assert max(max(s.staleness) for s in steps_a) >= 1  # stale updates were weighted
    b = hetero_server()
    steps_b = b.run(sgd_train(), version=6)
    assert steps_a == steps_b
    assert payload.encode(a.global_state) == payload.encode(b.global_state)
    assert hetero_server(seed=12).run(sgd_train(), version=6) != steps_a  # the seed matters
    # interrupted with one update in the buffer, through torch.save / weights_only load
    c = hetero_server()
    log_c: list[tuple[int, int, int]] = []
    train_c = sgd_train(log_c)
    while not (c.version >= 2 and len(c.buffer) == 1):
        c.step(train_c)
    buf = io.BytesIO()
    torch.save(c.state_dict(), buf)
    saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    resumed = hetero_server()  # a fresh process: new clock, new server
    resumed.load_state_dict(saved)
    assert len(resumed.buffer) == 1 and resumed.version == c.version
    resumed.run(sgd_train(log_c), version=6)
    assert resumed.history == steps_a
    assert payload.encode(resumed.global_state) == payload.encode(a.global_state)
    assert [(cl, v) for cl, v, _ in log_c] == [(cl, v) for cl, v, _ in log_a]
    with pytest.raises(ValueError, match="FedBuff checkpoint"):
        hetero_server().load_state_dict({**saved, "format": 0})
    with pytest.raises(ValueError, match="other settings: devices, seed differ"):
        hetero_server(
            seed=3, devices={**HETERO, "upload_latency_s": {"value": 0.5}}
        ).load_state_dict(saved)
    # a batch trainer (the jobs of one instant together, trained in any order) is the same
    d = hetero_server()

    def batch(jobs: Sequence[Job], base: StateDict) -> list[JobResult]:
        train = sgd_train()
        done = {j.job_id: train(j.client_id, j.base_version, base) for j in reversed(jobs)}
        return [done[j.job_id] for j in jobs]

    assert d.run(version=6, train_batch=batch) == steps_a
    assert payload.encode(d.global_state) == payload.encode(a.global_state)


def test_planned_jobs_train_in_batches_with_the_same_results() -> None:
    """With each job's work and bytes known at dispatch, the jobs train together when the
    first arrives: batches larger than one, the same events and tensors as eager training."""
    eager = hetero_server()
    expected = eager.run(sgd_train(), version=6)
    size = payload.encoded_size(initial())  # the structure's: every version's and upload's

    def plan(job: Job) -> JobPlan:
        return JobPlan(3, size, size)

    sizes: list[int] = []

    def batch(jobs: Sequence[Job], base: StateDict) -> list[JobResult]:
        sizes.append(len(jobs))
        return [train(j.client_id, j.base_version, base) for j in jobs]

    train = sgd_train()
    planned = hetero_server()
    assert planned.run(version=6, train_batch=batch, plan=plan) == expected
    assert payload.encode(planned.global_state) == payload.encode(eager.global_state)
    planned_sizes = sizes[:]
    sizes.clear()
    hetero_server().run(version=6, train_batch=batch)  # eager: one batch per dispatch instant
    # after the first K, eager training gets one job at a time here, planned larger batches
    # (and it has not yet trained the jobs that arrive after version 6)
    assert max(sizes[1:]) == 1 and max(planned_sizes[1:]) > 1
    assert len(planned_sizes) < len(sizes) and sum(planned_sizes) <= sum(sizes)
    sizes.clear()
    # resumed mid-buffer with untrained jobs in the queue: the same again
    c = hetero_server()
    while not (c.version >= 2 and c.buffer and any(e.result is None for e in c.queue.entries())):
        c.step(train_batch=batch, plan=plan)
    buf = io.BytesIO()
    torch.save(c.state_dict(), buf)
    resumed = hetero_server()
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    resumed.run(version=6, train_batch=batch, plan=plan)
    assert resumed.history == expected
    assert payload.encode(resumed.global_state) == payload.encode(eager.global_state)
    # a plan the training does not match is an error, never a silently wrong clock
    with pytest.raises(ValueError, match=r"trained with work and bytes .* planned"):
        hetero_server().run(version=1, train_batch=batch, plan=lambda j: JobPlan(3, size, size + 1))
