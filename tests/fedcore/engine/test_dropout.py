"""Clients that do not report: dropout, stragglers and dead worker processes.

Who reports is drawn from (seed, round, client, slot) before anything trains, so the dropped
set and the numbers do not depend on the workers; a dropped client's download is counted, no
upload; a round nobody reports in leaves the model and the server optimiser as they were; a
worker that dies costs a retry, then the client, never the run; workers die with their parent.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import payload
from fedcore.algorithms import FedAvg, build_algorithm
from fedcore.algorithms.base import ClientView
from fedcore.client import LocalConfig, cross_entropy
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.events import Callback, RoundRecord
from fedcore.sampling import client_availability, client_speed, round_outcomes
from fedcore.schedules import LRSchedule
from tests.fedcore.engine.support import CrashingFedAvg
from tests.helpers import Records, tiny_cnn, toy_data

REPO = Path(__file__).resolve().parents[3]
# unique shard sizes (a client is recognisable by its number of labels): 16 .. 96 samples
SHARDS = [np.arange(a, b) for a, b in [(0, 16), (16, 48), (48, 96), (96, 160), (160, 256)]]


def make_sim(
    *,
    rounds: int = 2,
    m: int = 5,
    workers: int = 0,
    seed: int = 0,
    algorithm=None,
    local: LocalConfig | None = None,
    callbacks=(),
    **federation,
) -> Simulation:
    return Simulation(
        model_fn=tiny_cnn,
        algorithm=algorithm or FedAvg(),
        train=toy_data(),
        test=toy_data(100, seed=1),
        shards=SHARDS,
        local=local or LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=rounds, clients_per_round=m, seed=seed, **federation),
        workers=workers,
        callbacks=callbacks,
    )


def model_bytes() -> int:
    torch.manual_seed(0)
    return len(payload.encode(tiny_cnn().state_dict()))


def same_state(a, b) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# ---- the draws ---------------------------------------------------------------------------
def test_outcomes_come_from_the_seed_alone():
    cfg = FederationConfig(rounds=5, clients_per_round=5, dropout=0.5, seed=3)
    clients, steps = list(range(20)), [4] * 20
    a = round_outcomes(cfg, 2, clients, steps)
    assert a == round_outcomes(cfg, 2, clients, steps)  # the same seed: the same outcomes
    assert {o.status for o in a} == {"reported", "dropped"}
    assert a != round_outcomes(cfg, 3, clients, steps)  # another round: other draws
    other = FederationConfig(rounds=5, clients_per_round=5, dropout=0.5, seed=4)
    assert a != round_outcomes(other, 2, clients, steps)
    # no dropout, no deadline: everyone reports, nothing is drawn
    plain = FederationConfig(rounds=5, clients_per_round=5)
    assert {o.status for o in round_outcomes(plain, 1, clients, steps)} == {"reported"}


def test_availability_and_speed_are_per_client_and_fixed():
    fixed = FederationConfig(rounds=1, clients_per_round=1, dropout=0.3)
    assert client_availability(fixed, 7) == pytest.approx(0.7)
    beta = FederationConfig(
        rounds=1, clients_per_round=1, dropout=0.3, availability_concentration=2.0, seed=1
    )
    p = [client_availability(beta, c) for c in range(400)]
    assert p == [client_availability(beta, c) for c in range(400)]
    assert len(set(p)) == 400 and all(0.0 <= x <= 1.0 for x in p)
    assert np.mean(p) == pytest.approx(0.7, abs=0.05)  # Beta mean 1 - dropout
    assert client_speed(fixed, 3) == 1.0
    spread = FederationConfig(rounds=1, clients_per_round=1, speed_spread=0.5, deadline_steps=4)
    speeds = [client_speed(spread, c) for c in range(50)]
    assert len(set(speeds)) == 50 and speeds == [client_speed(spread, c) for c in range(50)]
    # the deadline: a client that would take more steps than deadline x speed is a straggler
    out = round_outcomes(spread, 1, list(range(50)), [4] * 50)
    for s, o in zip(speeds, out, strict=True):
        assert o.status == ("reported" if 4 <= int(4 * s) else "straggler")


def test_bad_values_are_one_line():
    for kw in (
        {"dropout": 1.0},
        {"dropout": -0.1},
        {"availability_concentration": 0.0},
        {"deadline_steps": 0},
        {"speed_spread": -1.0},
        {"stragglers": "wait"},
    ):
        with pytest.raises(ConfigError, match="federation"):
            FederationConfig(rounds=1, clients_per_round=1, **kw)


def test_config_keys_map_to_the_engine_and_are_dumped_only_when_set():
    from tasks.config import Params

    plain = Params()
    assert not any("dropout" in k or "deadline" in k for k in plain.flat())
    p = Params.model_validate(
        {"federation": {"dropout": 0.2, "deadline_steps": 3, "stragglers": "partial"}}
    )
    flat = p.flat()
    assert flat["federation.dropout"] == 0.2 and flat["federation.stragglers"] == "partial"
    assert "federation.speed_spread" not in flat


# ---- the engine --------------------------------------------------------------------------
def test_dropout_is_deterministic_whatever_the_workers():
    runs = []
    for workers in (0, 1):
        rec = Records()
        sim = make_sim(rounds=3, workers=workers, dropout=0.5, callbacks=[rec])
        h = sim.run()
        runs.append((sim.global_state, h, rec))
    (ga, ha, ra), (gb, hb, rb) = runs
    assert [r.dropped for r in ha.rounds] == [r.dropped for r in hb.rounds]
    assert any(r.dropped for r in ha.rounds)
    assert same_state(ga, gb)
    assert [(c.client_id, c.status, c.upload_bytes) for c in ra.clients] == [
        (c.client_id, c.status, c.upload_bytes) for c in rb.clients
    ]


def test_a_dropped_client_downloads_but_does_not_upload():
    rec = Records()
    h = make_sim(rounds=3, dropout=0.5, callbacks=[rec]).run()
    size = model_bytes()
    dropped = [c for c in rec.clients if c.status == "dropped"]
    assert dropped and all(c.upload_bytes == 0 and c.download_bytes == size for c in dropped)
    assert all(not c.accepted and c.num_steps == 0 for c in dropped)
    for r in h.rounds:
        mine = [c for c in rec.clients if c.round == r.round]
        assert r.download_bytes == len(r.clients) * size  # every sampled client downloaded
        assert r.upload_bytes == sum(c.upload_bytes for c in mine)
        assert r.upload_bytes == (len(r.clients) - len(r.dropped)) * size
        assert r.dropped == tuple(c.client_id for c in mine if c.status == "dropped")
        assert r.extra["clients_dropped"] == len(r.dropped)
        assert r.extra["clients_reported"] == len(r.clients) - len(r.dropped)
        assert r.to_dict()["dropped"] == list(r.dropped) or not r.dropped
    assert h.rounds[-1].cum_upload_bytes == sum(c.upload_bytes for c in rec.clients)


def _all_dropped_in_round_2(m: int, dropout: float) -> int:
    """A seed whose round 1 has reports and whose round 2 has none."""
    for seed in range(200):
        cfg = FederationConfig(rounds=2, clients_per_round=m, dropout=dropout, seed=seed)
        picks = [FedAvg().select_clients(cfg, [len(s) for s in SHARDS], r) for r in (1, 2)]
        r1, r2 = (round_outcomes(cfg, r, p, [1] * m) for r, p in zip((1, 2), picks, strict=True))
        if any(o.trains for o in r1) and not any(o.trains for o in r2):
            return seed
    raise AssertionError("no such seed")


class Snapshot(Callback):
    def __init__(self) -> None:
        self.sim: Simulation | None = None
        self.states: list[tuple[dict, dict]] = []

    def on_round_end(self, record: RoundRecord) -> None:
        assert self.sim is not None
        state = {k: v.clone() for k, v in self.sim.global_state.items()}
        server = self.sim.algorithm.state_dict()
        self.states.append((state, {k: _clone(v) for k, v in server.items()}))


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def test_a_round_nobody_reports_in_changes_nothing_and_says_so():
    seed = _all_dropped_in_round_2(2, 0.7)
    snap = Snapshot()
    sim = make_sim(rounds=2, m=2, seed=seed, dropout=0.7, callbacks=[snap],
                   algorithm=build_algorithm("fedadam"))  # fmt: skip
    snap.sim = sim
    h = sim.run()
    (s1, server1), (s2, server2) = snap.states
    assert server1 and _equal(server1, server2)  # the FedAdam moments are untouched
    assert same_state(s1, s2)
    last = h.rounds[1]
    assert last.extra["no_client_reported"] == 1.0 and "no_client_reported" not in h.rounds[0].extra
    assert last.dropped == last.clients and last.upload_bytes == 0
    assert last.download_bytes == 2 * model_bytes()
    assert last.accuracy is not None  # evaluation happens as scheduled
    assert np.isnan(last.train_loss) and h.diverged_at_round is None


def test_stragglers_dropped_or_cut_at_the_deadline():
    # 1 epoch, batches of 16: the clients take 1, 2, 3, 4 and 6 steps; the deadline is 2
    local = LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4)
    steps = {0: 1, 1: 2, 2: 3, 3: 4, 4: 6}
    rec_drop, rec_part = Records(), Records()
    drop = make_sim(rounds=1, local=local, deadline_steps=2, callbacks=[rec_drop])
    h_drop = drop.run()
    assert h_drop.rounds[0].dropped == (2, 3, 4)
    for c in rec_drop.clients:
        late = steps[c.client_id] > 2
        assert c.status == ("straggler" if late else "reported")
        assert (c.upload_bytes == 0) == late and c.num_steps == (0 if late else steps[c.client_id])

    part = make_sim(rounds=1, local=local, deadline_steps=2, stragglers="partial",
                    callbacks=[rec_part])  # fmt: skip
    h_part = part.run()
    assert h_part.rounds[0].dropped == ()
    assert [(c.status, c.num_steps) for c in rec_part.clients] == [
        ("reported", 1), ("reported", 2), ("partial", 2), ("partial", 2), ("partial", 2)
    ]  # fmt: skip
    assert h_part.rounds[0].extra["clients_partial"] == 3.0
    # a cut update is the first steps of the same local training: max_steps 2 for everyone
    capped = make_sim(rounds=1, local=LocalConfig(batch_size=16, momentum=0.9,
                      weight_decay=5e-4, max_steps=2))  # fmt: skip
    capped.run()
    assert same_state(part.global_state, capped.global_state)


# ---- dead workers ------------------------------------------------------------------------
def test_a_worker_that_dies_once_costs_a_retry_not_the_run(tmp_path, capfd):
    algo = CrashingFedAvg(victim_samples=48, marker=str(tmp_path / "crashed"))
    rec, ref_rec = Records(), Records()
    sim = make_sim(rounds=1, workers=2, algorithm=algo, callbacks=[rec])
    h = sim.run()
    ref = make_sim(rounds=1, workers=0, callbacks=[ref_rec])
    h_ref = ref.run()
    assert (tmp_path / "crashed").exists()
    assert "worker process died" in capfd.readouterr().err
    assert same_state(sim.global_state, ref.global_state)  # the retry gives the same update
    assert h.rounds[0].dropped == () and h.rounds[0].extra == h_ref.rounds[0].extra
    assert (h.rounds[0].upload_bytes, h.rounds[0].download_bytes) == (
        h_ref.rounds[0].upload_bytes,
        h_ref.rounds[0].download_bytes,
    )
    assert h.rounds[0].accuracy == h_ref.rounds[0].accuracy


def test_a_worker_that_keeps_dying_drops_its_client(capfd):
    rec = Records()
    sim = make_sim(rounds=1, workers=2, algorithm=CrashingFedAvg(victim_samples=48),
                   callbacks=[rec])  # fmt: skip
    h = sim.run()
    err = capfd.readouterr().err
    assert "client 2 dropped" in err and len(err.strip().splitlines()) == 2
    r = h.rounds[0]
    assert r.dropped == (2,) and r.extra["clients_crashed"] == 1.0
    victim = next(c for c in rec.clients if c.client_id == 2)
    assert victim.status == "crashed" and victim.upload_bytes == 0
    assert victim.download_bytes == model_bytes()
    assert r.upload_bytes == 4 * model_bytes() and r.download_bytes == 5 * model_bytes()
    assert r.accuracy is not None and np.isfinite(r.train_loss)  # the 4 others averaged


@dataclass(frozen=True)
class SigkilledFedAvg(FedAvg):
    """FedAvg whose client with ``victim_samples`` samples gets its worker process killed by
    SIGKILL (as `kill -9 <worker pid>` from a shell would) whenever it trains."""

    victim_samples: int = -1

    def client_objective(self, global_state, client: ClientView):
        if len(client.labels) == self.victim_samples:
            os.kill(os.getpid(), signal.SIGKILL)
        return cross_entropy


def test_dropout_and_a_killed_worker_complete_with_exact_bytes(capfd):
    """Issue 16's done-when: dropout 0.3 and a worker killed by SIGKILL in the same run. The
    run completes; every sampled client's download counts, only arrived uploads count; the
    killed client (retried once, killed again) is dropped like a client that did not report."""
    rec = Records()
    victim = 32  # SHARDS[1]: client 1
    sim = make_sim(rounds=2, workers=2, dropout=0.3, algorithm=SigkilledFedAvg(victim),
                   callbacks=[rec])  # fmt: skip
    h = sim.run()
    size = model_bytes()
    err = capfd.readouterr().err
    assert "worker process died" in err and "Traceback" not in err
    assert len(h.rounds) == 2 and all(np.isfinite(r.train_loss) for r in h.rounds if r.accuracy)
    by_status = {c.status for c in rec.clients}
    assert {"dropped", "crashed"} <= by_status  # both kinds of no-report happened
    for r in h.rounds:
        mine = [c for c in rec.clients if c.round == r.round]
        reported = [c for c in mine if c.status not in ("dropped", "crashed")]
        assert r.download_bytes == len(r.clients) * size
        assert r.upload_bytes == len(reported) * size == sum(c.upload_bytes for c in mine)
        assert set(r.dropped) == {c.client_id for c in mine if c.status in ("dropped", "crashed")}
    crashed = [c for c in rec.clients if c.status == "crashed"]
    assert all(c.client_id == 1 and c.upload_bytes == 0 for c in crashed)
    assert h.rounds[-1].cum_upload_bytes == sum(c.upload_bytes for c in rec.clients)
    assert h.rounds[-1].cum_download_bytes == sum(c.download_bytes for c in rec.clients)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is dead
    except FileNotFoundError:
        return True


PARENT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from fedcore.algorithms import FedAvg
    from fedcore.client import LocalConfig
    from fedcore.engine import FederationConfig, Simulation
    from fedcore.schedules import LRSchedule
    from tests.helpers import tiny_cnn, toy_data

    sim = Simulation(
        model_fn=tiny_cnn, algorithm=FedAvg(), train=toy_data(), test=toy_data(100, seed=1),
        shards=[np.arange(200), np.arange(200, 400)], local=LocalConfig(batch_size=16),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=1, clients_per_round=2), workers=2, eval_chunk=25,
    )
    sim.backend.start(sim.global_state)
    sim.evaluate()  # 4 jobs: the pool starts its workers
    print(" ".join(str(p) for p in sim.backend.pool._processes), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_their_parent(tmp_path):
    # the killed parent's resource tracker reports its leaked semaphores: to a file
    err = (tmp_path / "stderr").open("w")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True
    )
    pids: list[int] = []
    try:
        line = parent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert pids, (tmp_path / "stderr").read_text()
        assert not any(_gone(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(p) for p in pids), "worker processes outlived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in pids:  # a failed test leaves no orphan behind
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
        err.close()


WATCHED = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; sys.platform = 'other'; from fedcore.jobs import die_with_parent; "
         "die_with_parent(int(sys.argv[1]), 0.1); print('armed', flush=True); time.sleep(600)",
         str(os.getpid())],
        stdout=subprocess.PIPE, text=True,
    )
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_watchdog_alone_ends_an_orphan():
    """Without prctl (another OS), the watchdog thread sees the parent gone and exits."""
    parent = subprocess.Popen([sys.executable, "-c", WATCHED], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    pid = 0
    try:
        pid = int(parent.stdout.readline())
        assert not _gone(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if pid and not _gone(pid):  # a failed test leaves no orphan behind
            os.kill(pid, signal.SIGKILL)


def _ignores(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = int(f.read().split("SigIgn:")[1].split()[0], 16)
    return bool(mask >> (sig - 1) & 1)


def _pooled(workers: int) -> Simulation:
    """Two clients of a tiny CNN on a pool of ``workers`` processes."""
    return Simulation(
        model_fn=tiny_cnn, algorithm=FedAvg(), train=toy_data(), test=toy_data(100, seed=1),
        shards=[np.arange(200), np.arange(200, 400)], local=LocalConfig(batch_size=16),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=1, clients_per_round=2), workers=workers,
        eval_chunk=25,
    )  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stop_signal_to_the_group_leaves_the_workers_to_their_parent(capfd):
    """SIGINT/SIGTERM sent to the run's process group (Ctrl-C, kill -TERM -pgid) reach the
    pool's workers too: they ignore them, so the parent's training thread never takes them
    for crashed workers (no "a worker process died", no job retried) while it stops."""
    sim = _pooled(workers=2)
    sim.backend.start(sim.global_state)
    try:
        before = sim.evaluate()  # the pool starts its workers
        pids = list(sim.backend.pool._processes)
        assert len(pids) == 2
        deadline = time.monotonic() + 60  # a worker may still be starting (one served all)
        while not all(_ignores(p, signal.SIGTERM) for p in pids):
            assert time.monotonic() < deadline, "the workers never set their signals"
            time.sleep(0.1)
        assert all(_ignores(p, signal.SIGINT) for p in pids)
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert not any(_gone(p) for p in pids)
        assert sim.evaluate() == before  # the same workers answer
        assert list(sim.backend.pool._processes) == pids
        assert "died" not in capfd.readouterr().err
    finally:
        sim.backend.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stop_signal_while_a_worker_starts_does_not_kill_it(capfd):
    """A Ctrl-C that reaches a worker while its interpreter is still starting (before its
    initializer ignores the signal) would kill it: the pool spawns it with SIGINT and SIGTERM
    blocked, so the signal waits and is dropped once ignored. The signals go to the worker
    right after the spawn, long before it has imported torch."""
    sim = _pooled(workers=1)
    backend = sim.backend
    backend.start(sim.global_state)
    try:
        future = backend._submit(os.getpid, ())  # spawns the one worker
        (pid,) = list(backend.pool._processes)
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
        assert future.result(timeout=120) == pid  # the same worker, alive, served it
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # restored
        assert "died" not in capfd.readouterr().err
    finally:
        backend.close()


# ---- the cohort engine -------------------------------------------------------------------
@pytest.mark.parametrize("stragglers", ["drop", "partial"])
def test_cohort_equals_sequential_with_dropout(stragglers):
    from tests.fedcore.cohort.support import SHARDS as COHORT_SHARDS
    from tests.fedcore.cohort.support import Model, assert_same, images

    def run(engine: str):
        perm = np.random.default_rng(0).permutation(400)
        records = Records()
        sim = Simulation(
            model_fn=Model("full"),
            algorithm=build_algorithm("fedprox"),
            train=images(400, 0),
            test=images(100, 1),
            shards=[perm[a:b] for a, b in COHORT_SHARDS],
            noise_var=[0.0, 0.1, 0.0, 0.2, 0.0],
            local=LocalConfig(batch_size=16, momentum=0.9, weight_decay=5e-4, local_epochs=2),
            lr_schedule=LRSchedule(lr=0.05),
            federation=FederationConfig(
                rounds=3,
                clients_per_round=4,
                seed=1,
                dropout=0.3,
                deadline_steps=12,
                speed_spread=0.5,
                stragglers=stragglers,
            ),  # fmt: skip
            workers=0,
            engine=engine,
            callbacks=[records],
        )
        h = sim.run()
        return sim.global_state, h, records.clients

    seq, coh = run("sequential"), run("cohort")
    # clients that trained: to 1e-9 (assert_same); the others: the same records, no loss
    trained = [(g, h, [c for c in cs if c.num_steps]) for g, h, cs in (seq, coh)]
    assert_same(*trained)
    idle = [[c for c in cs if not c.num_steps] for _, _, cs in (seq, coh)]
    assert [dataclasses.replace(c, seconds=0.0, train_loss=0.0) for c in idle[0]] == [
        dataclasses.replace(c, seconds=0.0, train_loss=0.0) for c in idle[1]
    ]
    assert [r.dropped for r in seq[1].rounds] == [r.dropped for r in coh[1].rounds]
    assert [c.status for c in seq[2]] == [c.status for c in coh[2]]
    statuses = {c.status for c in seq[2]}
    assert (
        "dropped" in statuses
        and ({"partial"} if stragglers == "partial" else {"straggler"}) <= statuses
    )
