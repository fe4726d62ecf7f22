"""Where a round's clients train and where the global model is evaluated: the backends.

* :class:`SequentialBackend`: in this process, one client after another (on CUDA, or on the
  CPU with ``workers=0``), each single-threaded on the CPU: the arithmetic of a worker.
* :class:`PoolBackend`: a pool of worker processes, each one model, one thread. On this
  project's 2-core CPU two single-thread clients side by side outrun one client on two
  threads, so the CPU fans out to single-thread workers.
* :class:`CohortBackend`: the round's clients train together in this process as one batched
  computation per step (``fedcore.cohort``), with every core.

The first two run ``fedcore.jobs``' client and evaluation jobs, bytes in and bytes out
(:class:`WireBackend`); another backend of that kind (say, a cluster of remote workers) is a
subclass that says how it maps jobs (``_map``) and how it starts and stops.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from fedcore import payload
from fedcore.algorithms.base import ClientTask
from fedcore.client import ImageData
from fedcore.cohort import CohortTrainer, check_batchable
from fedcore.cohort.round import cohort_round
from fedcore.jobs import (
    ClientResult,
    Workload,
    client_job,
    eval_job,
    eval_state,
    receive,
    worker_client_job,
    worker_eval_job,
)
from fedcore.payload import StateDict

# A client's download as ``fedcore.wire.downloads`` gives it: (download, held, download bytes).
Download = tuple[bytes | None, bytes | None, int]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The global model on the test set: totals over its samples."""

    correct: int
    loss: float  # summed over the samples
    samples: int
    exit_correct: Sequence[int]  # correct per early exit (empty without exits)

    @classmethod
    def total(cls, parts: Sequence[tuple[int, float, int, tuple[int, ...]]]) -> Evaluation:
        """The sums of evaluation jobs' results (``fedcore.jobs.eval_job``), in job order."""
        return cls(
            correct=sum(p[0] for p in parts),
            loss=sum(p[1] for p in parts),
            samples=sum(p[2] for p in parts),
            exit_correct=[sum(c) for c in zip(*(p[3] for p in parts), strict=True)],
        )


@dataclass(frozen=True)
class Placement:
    """Where and how a run's clients train, as ``Simulation`` resolved it: its worker
    processes, clients per round, cohort size, the adapter's trainable keys and Ray's settings
    (None: this machine). Every backend is made from a workload and one of these."""

    workers: int = 0
    clients_per_round: int = 1
    cohort_size: int | None = None
    trainable: frozenset[str] | None = None
    ray: Any = None  # fedcore.engine.ray_cluster.RaySettings


# Where the clients train, by name -> ``module:class``: a backend's module is imported when a
# run uses it (the Ray backends' only by Ray runs).
BACKENDS: dict[str, str] = {
    "sequential": "fedcore.engine.backends:SequentialBackend",
    "pool": "fedcore.engine.pool:PoolBackend",
    "cohort": "fedcore.engine.backends:CohortBackend",
    "ray": "fedcore.engine.ray_pool:RayBackend",
    "ray_cohort": "fedcore.engine.ray_pool:RayCohortBackend",
}


def backend_name(engine: str, where: Placement) -> str:
    """The backend of ``engine`` (cohort | sequential) at ``where``: the cohort engine, here
    or on Ray actors; else Ray actors, worker processes, or this process."""
    if engine == "cohort":
        return "ray_cohort" if where.ray is not None else "cohort"
    if where.ray is not None:
        return "ray"
    return "pool" if where.workers >= 1 else "sequential"


def make_backend(name: str, work: Workload, where: Placement) -> Backend:
    """Backend ``name`` of :data:`BACKENDS` for ``work`` at ``where``."""
    module, _, cls = BACKENDS[name].partition(":")
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    return backend.create(work, where)


class Backend(ABC):
    """Trains a round's clients and evaluates the global model for ``Simulation``.

    Called in this order: :meth:`start` once before the first round, then :meth:`train` and
    :meth:`evaluate` any number of times, then :meth:`close`. Whatever the backend, the
    results are those of the sequential reference: every random choice comes with the task
    (its seed), results come back in task order, never in completion order.
    """

    # The downloads are encoded for the clients to decode (the wire); False: the clients read
    # the global model in place and only the download bytes are counted (``wire.downloads``).
    encodes: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def create(cls, work: Workload, where: Placement) -> Backend:
        """This backend for ``work`` at ``where`` (what of it the backend uses)."""

    def nodes(self) -> Any:
        """A callback recording which node trained each client, for backends that place
        clients on other machines (Ray); None: every client trains on this machine."""
        return None

    def start(self, global_state: StateDict) -> StateDict:
        """Get ready to train; the global state where the backend keeps it for the run."""
        return global_state

    @abstractmethod
    def train(
        self,
        global_state: StateDict,
        tasks: Sequence[ClientTask],
        *,
        lr: float,
        seeds: Sequence[int],
        max_steps: Sequence[int | None],
        downloads: Sequence[Download],
        start: StateDict | None = None,
        memories: Sequence[StateDict | None] | None = None,
    ) -> list[ClientResult | None]:
        """Train ``tasks`` (the round's clients that train, in sampling order) from the
        global model: per task its seed, its step cap (a straggler's partial update; None:
        the configured local training) and its download. One result per task, in task
        order; None: the client was lost (its worker died twice), counted as crashed.
        ``start``: the state the clients start from where a download codec rounded the global
        model (None: the global model); ``memories``: per task, the client's error-feedback
        memory (``fedcore.codecs``; None: none)."""

    @abstractmethod
    def evaluate(self, global_state: StateDict, chunks: Sequence[np.ndarray]) -> Evaluation:
        """The global model on the test set, ``chunks`` the test indices in evaluation jobs."""

    @abstractmethod
    def close(self) -> None:
        """Release what :meth:`start` took (worker processes, device copies)."""


class WireBackend(Backend):
    """Clients and evaluators run ``fedcore.jobs``' jobs: they decode what they receive and
    encode what they send back, and the server decodes the uploads (``fedcore.jobs.receive``)."""

    work: Workload

    @abstractmethod
    def _map(
        self, fn_local: Callable, fn_worker: Callable, jobs: list[tuple], *, what: str = "job"
    ) -> list:
        """The jobs' results in submission order: ``fn_local(context, *job)`` in this process,
        ``fn_worker(*job)`` in a worker. ``what`` "client": a lost job's result may be None."""

    def train(
        self,
        global_state: StateDict,
        tasks: Sequence[ClientTask],
        *,
        lr: float,
        seeds: Sequence[int],
        max_steps: Sequence[int | None],
        downloads: Sequence[Download],
        start: StateDict | None = None,
        memories: Sequence[StateDict | None] | None = None,
    ) -> list[ClientResult | None]:
        mems = [None] * len(tasks) if memories is None else memories
        jobs: list[tuple[Any, ...]] = [
            (task, lr, seed, *down[:2], cap, None if mem is None else payload.encode(mem))
            for task, seed, cap, down, mem in zip(
                tasks, seeds, max_steps, downloads, mems, strict=True
            )
        ]
        wire = self._map(client_job, worker_client_job, jobs, what="client")
        codecs = self.work.codecs
        return [None if res is None else receive(res, codecs, global_state) for res in wire]

    def evaluate(self, global_state: StateDict, chunks: Sequence[np.ndarray]) -> Evaluation:
        blob = payload.encode(global_state)
        return Evaluation.total(self._map(eval_job, worker_eval_job, [(blob, c) for c in chunks]))


class SequentialBackend(WireBackend):
    """In this process, one client after another; on the CPU single-threaded, the same
    arithmetic as a single-thread worker."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.ctx: Workload | None = None

    @classmethod
    def create(cls, work: Workload, where: Placement) -> SequentialBackend:
        return cls(work)

    def start(self, global_state: StateDict) -> StateDict:
        self.ctx = self.work.on_device()  # the initial model trains the clients in turn
        return global_state

    def _map(
        self, fn_local: Callable, fn_worker: Callable, jobs: list[tuple], *, what: str = "job"
    ) -> list:
        assert self.ctx is not None, "start() first"
        threads = torch.get_num_threads()
        if self.work.device == "cpu":
            torch.set_num_threads(1)  # the same arithmetic as a single-thread worker
        try:
            return [fn_local(self.ctx, *job) for job in jobs]
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Nothing to release: the model is this process's (it stays usable)."""


class CohortBackend(Backend):
    """The round's clients train as cohorts in this process (``fedcore.cohort``).

    Device-resident: uint8 images and labels are moved once; batches are gathered, converted
    and normalised on the device, the global model stays there and aggregation and server
    optimisers run there. Nothing crosses to the host per round but byte counts
    (``payload.encoded_size``) and metrics.
    """

    encodes = False

    def __init__(
        self,
        work: Workload,
        max_clients: int | None = None,
        trainable: frozenset[str] | None = None,
    ) -> None:
        check_batchable(work.model)
        self.work = work
        self.max_clients = max_clients  # clients per cohort (None: as many as memory allows)
        self.trainable = trainable  # the adapter's trainable keys (None: every parameter)
        self.ctx: Workload | None = None
        self.trainer: CohortTrainer | None = None
        self.train_data: ImageData = work.train
        self.test_data: ImageData = work.test

    @classmethod
    def create(cls, work: Workload, where: Placement) -> CohortBackend:
        return cls(work, max_clients=where.cohort_size, trainable=where.trainable)

    def start(self, global_state: StateDict) -> StateDict:
        work = self.work
        self.ctx = work.on_device()
        self.trainer = CohortTrainer(
            self.ctx.model, device=work.device, max_clients=self.max_clients
        )
        to = getattr(work.train, "to", None)
        self.train_data = work.train.to(work.device) if to else work.train
        to = getattr(work.test, "to", None)
        self.test_data = work.test.to(work.device) if to else work.test
        return {k: v.to(work.device) for k, v in global_state.items()}

    def train(
        self,
        global_state: StateDict,
        tasks: Sequence[ClientTask],
        *,
        lr: float,
        seeds: Sequence[int],
        max_steps: Sequence[int | None],
        downloads: Sequence[Download],
        start: StateDict | None = None,
        memories: Sequence[StateDict | None] | None = None,
    ) -> list[ClientResult | None]:
        assert self.trainer is not None, "start() first"
        work = self.work
        return list(
            cohort_round(
                self.trainer, work.algorithm, global_state, self.train_data, work.train.labels,
                work.shards, work.noise_var, work.local, list(tasks), lr, list(seeds),
                list(max_steps), codecs=work.codecs, start=start, memories=memories,
            )
        )  # fmt: skip

    def evaluate(self, global_state: StateDict, chunks: Sequence[np.ndarray]) -> Evaluation:
        assert self.trainer is not None and self.ctx is not None, "start() first"
        # Cached frozen features of the test set (head; the CLS history of lw_linear/lw_mlp).
        res = self.trainer.caches.evaluate(
            global_state, self.test_data, np.arange(len(self.work.test)), self.trainable
        )
        if res is not None:
            correct, loss, n, per_exit = res
            return Evaluation(correct, loss, n, per_exit)
        # in this process, on the device-resident test set
        ctx = dataclasses.replace(self.ctx, test=self.test_data)
        return Evaluation.total([eval_state(ctx, global_state, c) for c in chunks])

    def close(self) -> None:
        self.train_data, self.test_data = self.work.train, self.work.test


def job_clients(what: str, job: tuple) -> list[int]:
    """The clients a job trains: a client job's (its task first), a cohort job's (its tasks
    second), none for an evaluation job."""
    if what == "client":
        return [job[0].client_id]
    if what == "cohort":
        return [t.client_id for t in job[1]]
    return []


@dataclass
class Retries:
    """What the process pool and the Ray actors do with jobs lost to a dead worker (a
    process or an actor: ``worker`` names it): each runs again once, alone; lost again, a
    client or cohort job's clients are dropped (its result None: the engine counts them as
    crashed) and any other job is an error; ``give_up`` client jobs lost in a row (each after
    its retry: a worker that cannot start loses every job) end the run."""

    worker: str  # "worker process", "Ray actor"
    workers: str  # "worker processes", "Ray actors"
    give_up: int = 3
    streak: int = 0  # jobs lost in a row

    def retry(
        self,
        jobs: list[tuple],
        out: list,
        lost: list[int],
        *,
        what: str,
        how: str,
        again: Callable[[int], Any],
        errors: type[BaseException] | tuple[type[BaseException], ...],
        recover: Callable[[], None],
    ) -> None:
        """``out[i] = again(i)`` for each lost job ``i``, in job order, ``recover()`` after
        each that is lost again (``errors``); ``how``: how they are retried, for the line
        that says so."""
        if not lost:
            return
        print(
            f"fedapt: a {self.worker} died; {len(lost)} {what} job(s) lost, {how}",
            file=sys.stderr,
            flush=True,
        )
        for i in sorted(lost):
            try:
                out[i] = again(i)
                self.streak = 0
                continue
            except errors:
                recover()
            self.streak += 1
            if what == "job" or self.streak >= self.give_up:
                raise RuntimeError(
                    f"{self.workers} died on {self.streak} {what} job(s) in a row, each "
                    f"retried once: giving up (a {self.worker}'s own error, if any, is above)"
                )
            ids = job_clients(what, jobs[i])
            who = (
                f"client {ids[0]} dropped: its"
                if len(ids) == 1
                else f"clients {', '.join(map(str, ids))} dropped: their"
            )
            print(
                f"fedapt: {who} {self.worker} died again on the retry", file=sys.stderr, flush=True
            )
