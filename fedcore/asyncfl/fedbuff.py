"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation",
Algorithm 1) as an event-driven server on the virtual clock (``clock.DeviceClock``).

K = ``concurrency`` clients train at once, each from the model version it downloaded. An
upload arrives at its job's dispatch time + ``DeviceClock.job_duration`` (simulated seconds).
When B = ``buffer`` updates have arrived, the server steps (:func:`buffered_step`) and its
version moves on; the staleness of an update is the current version - its base version.
Freed slots go to idle clients that are online at that simulated time (an offline client never
receives a job), picked by a seeded draw; when none is online the server waits (a wake-up at
the first time one comes online).

Determinism: events are processed in order of simulated time; arrivals at the same time in
the order of a seeded key of (run seed, client, job id) -- never of insertion -- and every
arrival of an instant before that instant's dispatches. Every draw is derived from (run seed,
counter), so the order of events is a pure function of (seed, profiles, byte counts, work),
whichever backend trains the jobs. The buffer is reduced in (client, job) order, so float
rounding does not depend on arrival order either.

Training is a callback: ``train(client_id, base_version, base_state) -> JobResult`` (or a
batch trainer for several jobs of one base version). A job trains when it is dispatched and its
result waits in the event queue until its arrival time; or, given a ``plan`` of each job's work
and bytes (known before training), the jobs train only when the first of them arrives, all the
untrained ones together: larger batches for a worker pool or Ray actors, the same results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from fedcore.asyncfl.buffer import buffered_step
from fedcore.asyncfl.clock import DeviceClock
from fedcore.asyncfl.config import AsyncConfig, check_async
from fedcore.asyncfl.events import (
    BatchTrainer,
    Entry,
    EventQueue,
    Job,
    JobPlan,
    JobResult,
    Planner,
    Trainer,
    one_by_one,
)
from fedcore.errors import ConfigError
from fedcore.payload import StateDict
from fedcore.sampling import derive_seed

DISPATCH_STREAM = 23  # fedcore.sampling's streams: which idle online clients get the free slots
FORMAT = 1  # of :meth:`FedBuffServer.state_dict`


@dataclass(frozen=True)
class Aggregation:
    """One server step: the model moved to ``version`` at ``sim_time``. Per buffered update,
    in the order it was reduced: its client, job, staleness and weight s(tau) x p_i."""

    version: int
    sim_time: float
    clients: tuple[int, ...]
    jobs: tuple[int, ...]
    staleness: tuple[int, ...]
    weights: tuple[float, ...]
    num_samples: int
    train_loss: float
    cum_download_bytes: int
    cum_upload_bytes: int
    arrivals: tuple[int, ...]  # every job that arrived since the last step, in event order
    rejected: int  # of those, the non-finite uploads


class FedBuffServer:
    """The FedBuff server on ``clock``: :meth:`step` processes one simulated instant,
    :meth:`run` steps until the model reaches a version. Between steps, :meth:`state_dict`
    holds everything the next steps read (a checkpoint mid-buffer resumes identically)."""

    def __init__(
        self, cfg: AsyncConfig, clock: DeviceClock, global_state: StateDict, *, seed: int
    ) -> None:
        check_async(cfg, clock.num_clients)
        self.cfg, self.clock, self.seed = cfg, clock, seed
        self.global_state = dict(global_state)
        self.version = 0
        self.bases: dict[int, StateDict] = {}  # older versions that queued or buffered jobs hold
        self.now = 0.0
        self.queue = EventQueue(seed)
        self.buffer: list[Entry] = []
        self.busy: set[int] = set()
        self.next_job = 0
        self.draws = 0  # dispatch draws so far (DISPATCH_STREAM's counter)
        self.wake: float | None = None  # when an idle offline client comes online
        self.started = False
        self.cum_down = self.cum_up = 0
        self.arrived: list[int] = []  # jobs arrived since the last step (Aggregation.arrivals)
        self.rejected = 0
        self.history: list[Aggregation] = []

    # ---- the event loop -----------------------------------------------------------------
    def run(
        self,
        train: Trainer | None = None,
        *,
        version: int,
        train_batch: BatchTrainer | None = None,
        plan: Planner | None = None,
        on_instant: Callable[[FedBuffServer], None] | None = None,
    ) -> list[Aggregation]:
        """Step until the model reaches ``version``; the steps taken back. ``on_instant``:
        called after every instant (a checkpoint may be written there)."""
        done: list[Aggregation] = []
        while self.version < version:
            done += self.step(train, train_batch=train_batch, plan=plan)
            if on_instant is not None:
                on_instant(self)
        return done

    def step(
        self,
        train: Trainer | None = None,
        *,
        train_batch: BatchTrainer | None = None,
        plan: Planner | None = None,
    ) -> list[Aggregation]:
        """The next simulated instant: its arrivals (in tie order; a full buffer steps the
        model), then its dispatches to the free slots. The server steps it took back.

        ``plan``: each job's work and bytes before it trains (``JobPlan``). Its arrival time
        is then known at dispatch, and the jobs train only when the first of them arrives,
        all the untrained ones together (per base version): batches of about B jobs for a
        worker pool or Ray actors instead of one, and the same events and tensors."""
        if (train is None) == (train_batch is None):
            raise TypeError("step() takes one of train, train_batch")
        trainer = train_batch if train_batch is not None else one_by_one(train)  # type: ignore[arg-type]
        if not self.started:
            self.started = True
            self._dispatch(trainer, plan)
            return []
        t = min(self.queue.next_time(), math.inf if self.wake is None else self.wake)
        if math.isinf(t):
            raise RuntimeError("FedBuff: no job is pending and no idle client comes online again")
        self.now = t
        if self.wake == t:
            self.wake = None
        steps: list[Aggregation] = []
        arrivals = self.queue.pop_at(t)
        if any(e.result is None for e in arrivals):
            arrivals = self._train_planned(trainer, arrivals)
        for e in arrivals:
            self.busy.discard(e.job.client_id)
            self.arrived.append(e.job.job_id)
            self.cum_up += e.trained.up_bytes
            if not e.trained.finite:
                self.rejected += 1
                continue
            self.buffer.append(e)
            if len(self.buffer) == self.cfg.buffer:
                steps.append(self._aggregate())
        self._release()
        self._dispatch(trainer, plan)
        return steps

    def _aggregate(self) -> Aggregation:
        buffer = sorted(self.buffer, key=lambda e: (e.job.client_id, e.job.job_id))
        new, weights = buffered_step(self.global_state, self.version, self.bases, buffer, self.cfg)
        self.bases[self.version] = self.global_state
        self.global_state = new
        self.version += 1
        n = [e.trained.num_samples for e in buffer]
        record = Aggregation(
            version=self.version,
            sim_time=self.now,
            clients=tuple(e.job.client_id for e in buffer),
            jobs=tuple(e.job.job_id for e in buffer),
            staleness=tuple(self.version - 1 - e.job.base_version for e in buffer),
            weights=tuple(weights),
            num_samples=sum(n),
            train_loss=float(np.average([e.trained.train_loss for e in buffer], weights=n))
            if sum(n)
            else math.nan,
            cum_download_bytes=self.cum_down,
            cum_upload_bytes=self.cum_up,
            arrivals=tuple(self.arrived),
            rejected=self.rejected,
        )
        self.buffer, self.arrived, self.rejected = [], [], 0
        self.history.append(record)
        return record

    def _release(self) -> None:
        """Forget the versions no queued or buffered job is based on."""
        held = {e.job.base_version for e in self.buffer} | {
            e.job.base_version for e in self.queue.entries()
        }
        self.bases = {v: s for v, s in self.bases.items() if v in held}

    def _train_planned(self, trainer: BatchTrainer, arrivals: list[Entry]) -> list[Entry]:
        """Train every untrained job (the ``arrivals`` and those queued), one batch per base
        version (oldest first, jobs in dispatch order); the arrivals back, trained."""
        queued = [e for e in self.queue.entries() if e.result is None]
        pending = sorted(
            [e for e in arrivals if e.result is None] + queued, key=lambda e: e.job.job_id
        )
        done: dict[int, Entry] = {}
        for v in sorted({e.job.base_version for e in pending}):
            group = [e for e in pending if e.job.base_version == v]
            base = self.global_state if v == self.version else self.bases[v]
            results = _train(trainer, [e.job for e in group], base)
            for e, res in zip(group, results, strict=True):
                work = _work(res)
                if e.plan != (work, res.down_bytes, res.up_bytes):
                    raise ValueError(
                        f"job {e.job.job_id} (client {e.job.client_id}) trained with work and bytes "
                        f"{(work, res.down_bytes, res.up_bytes)}, planned {tuple(e.plan or ())}"
                    )
                done[e.job.job_id] = replace(e, result=res)
        for e in queued:
            self.queue.fill(done[e.job.job_id])
        return [done.get(e.job.job_id, e) for e in arrivals]

    def _dispatch(self, trainer: BatchTrainer, plan: Planner | None) -> None:
        """Fill the free slots with idle clients online now (a seeded uniform draw, sorted),
        trained from the current model; else wake up when the first idle one comes online."""
        free = self.cfg.concurrency - len(self.busy)
        if free <= 0:
            self.wake = None
            return
        idle = [c for c in range(self.clock.num_clients) if c not in self.busy]
        online = [c for c in idle if self.clock.online(c, self.now)]
        if online:
            rng = np.random.default_rng(derive_seed(self.seed, DISPATCH_STREAM, self.draws))
            self.draws += 1
            picked = sorted(
                int(c) for c in rng.choice(online, size=min(free, len(online)), replace=False)
            )
            jobs = [Job(self.next_job + i, c, self.version, self.now) for i, c in enumerate(picked)]
            self.next_job += len(jobs)
            if plan is not None:  # trained when the first of them arrives
                for job in jobs:
                    p = JobPlan(*plan(job))
                    self._queue(Entry(self.now, job, None, p), p.work, p.down_bytes, p.up_bytes)
            else:
                for job, res in zip(jobs, _train(trainer, jobs, self.global_state), strict=True):
                    self._queue(Entry(self.now, job, res), _work(res), res.down_bytes, res.up_bytes)
            free -= len(jobs)
        rest = [c for c in idle if c not in self.busy]
        wake = min((self.clock.next_online(c, self.now) for c in rest), default=math.inf)
        self.wake = wake if free > 0 and math.isfinite(wake) else None

    def _queue(self, e: Entry, work: float, down_bytes: int, up_bytes: int) -> None:
        """``e`` dispatched now, queued at its arrival time on the clock."""
        duration = self.clock.job_duration(e.job.client_id, work, down_bytes, up_bytes)
        self.queue.push(replace(e, time=self.now + duration))
        self.busy.add(e.job.client_id)
        self.cum_down += down_bytes

    # ---- checkpoints ----------------------------------------------------------------------
    def settings(self) -> dict[str, str | int]:
        """What a checkpoint must have been written with to resume this server."""
        return {
            "federation.async": repr(self.cfg),
            "devices": repr(self.clock.devices),
            "seed": self.seed,
            "clients": self.clock.num_clients,
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain Python and CPU tensors (``torch.load(weights_only=True)`` reads it): the
        model and the versions jobs are based on, the event queue, the buffer, the clock and
        the counters the seeded draws derive from. Valid between steps."""
        return {
            "format": FORMAT,
            "settings": self.settings(),
            "now": self.now,
            "version": self.version,
            "started": self.started,
            "next_job": self.next_job,
            "draws": self.draws,
            "wake": self.wake,
            "cum_down": self.cum_down,
            "cum_up": self.cum_up,
            "arrived": list(self.arrived),
            "rejected": self.rejected,
            "global_state": _cpu(self.global_state),
            "bases": {str(v): _cpu(s) for v, s in sorted(self.bases.items())},
            "queue": [_entry_dict(e) for e in self.queue.entries()],
            "buffer": [_entry_dict(e) for e in self.buffer],
            "history": [_record_dict(r) for r in self.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict` of a server of the same settings)."""
        if state.get("format") != FORMAT:
            raise ConfigError(
                f"not a FedBuff checkpoint of format {FORMAT} (got {state.get('format')!r})"
            )
        mine, theirs = self.settings(), state.get("settings", {})
        differ = [k for k in mine if theirs.get(k) != mine[k]]
        if differ:
            raise ConfigError(
                f"FedBuff checkpoint was written for other settings: {', '.join(differ)} differ"
            )
        missing = sorted(set(self.global_state) ^ set(state["global_state"]))
        if missing:
            raise ConfigError(
                f"FedBuff checkpoint model differs from this run's: {', '.join(missing[:4])}"
            )
        self.now, self.version = float(state["now"]), int(state["version"])
        self.started, self.next_job = bool(state["started"]), int(state["next_job"])
        self.draws = int(state["draws"])
        self.wake = None if state["wake"] is None else float(state["wake"])
        self.cum_down, self.cum_up = int(state["cum_down"]), int(state["cum_up"])
        self.arrived, self.rejected = [int(j) for j in state["arrived"]], int(state["rejected"])
        self.global_state = dict(state["global_state"])
        self.bases = {int(v): dict(s) for v, s in state["bases"].items()}
        self.queue = EventQueue(self.seed)
        for e in state["queue"]:
            self.queue.push(_entry(e))
        self.buffer = [_entry(e) for e in state["buffer"]]
        self.busy = {e.job.client_id for e in self.queue.entries()}
        self.history = [_record(r) for r in state["history"]]


def _cpu(state: Mapping[str, torch.Tensor]) -> StateDict:
    return {k: v.detach().to("cpu").clone() for k, v in state.items()}


def _entry_dict(e: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": e.time,
        "job": asdict(e.job),
        "plan": None if e.plan is None else list(e.plan),
        "result": None,
    }
    r = e.result
    if r is not None:
        out["result"] = {
            "update": _cpu(r.update),
            "num_samples": r.num_samples,
            "up_bytes": r.up_bytes,
            "down_bytes": r.down_bytes,
            "work": r.work,
            "train_loss": r.train_loss,
            "finite": r.finite,
        }
    return out


def _entry(d: Mapping[str, Any]) -> Entry:
    job = Job(**d["job"])
    plan = None if d["plan"] is None else JobPlan(float(d["plan"][0]), *map(int, d["plan"][1:]))
    r = d["result"]
    if r is None:
        return Entry(float(d["time"]), job, None, plan)
    result = JobResult(
        dict(r["update"]), int(r["num_samples"]), int(r["up_bytes"]), int(r["down_bytes"]),
        None if r["work"] is None else float(r["work"]), float(r["train_loss"]), bool(r["finite"]),
    )  # fmt: skip
    return Entry(float(d["time"]), job, result, plan)


def _record_dict(r: Aggregation) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(r).items()}


def _record(d: Mapping[str, Any]) -> Aggregation:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return Aggregation(**fields)


def _train(trainer: BatchTrainer, jobs: list[Job], base: Any) -> list[JobResult]:
    """``trainer``'s results for ``jobs`` from ``base``, one per job, as ``JobResult``s."""
    results = list(trainer(jobs, base))
    if len(results) != len(jobs):
        raise ValueError(f"the trainer returned {len(results)} results for {len(jobs)} jobs")
    return [JobResult(*res) for res in results]


def _work(res: JobResult) -> float:
    """A job's work: what the trainer reported, else its number of samples."""
    return float(res.num_samples if res.work is None else res.work)
