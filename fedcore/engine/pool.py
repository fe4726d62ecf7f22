"""The process-pool backend: each client trains in a worker process, one model, one thread.

Workers are spawned, build their model once (``fedcore.jobs.init_pool_worker``) and die with
this process, even when it is killed -9 (``fedcore.jobs.die_with_parent``). A job lost to a
dead worker is retried once, alone, on a restarted pool.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from fedcore.engine.backends import Placement, Retries, WireBackend, Workload
from fedcore.jobs import init_pool_worker
from fedcore.payload import StateDict


class PoolBackend(WireBackend):
    """``workers`` worker processes (spawned), each serving clients one after another."""

    def __init__(self, work: Workload, workers: int) -> None:
        self.work = work
        self.workers = workers
        self.pool: cf.ProcessPoolExecutor | None = None
        self.retries = Retries("worker process", "worker processes")

    @classmethod
    def create(cls, work: Workload, where: Placement) -> PoolBackend:
        return cls(work, where.workers)

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        # Workers die with this process (jobs.die_with_parent), even when it is killed -9.
        return cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=mp.get_context("spawn"),
            initializer=init_pool_worker,
            initargs=(os.getpid(), self.work.shipped()),
        )

    def start(self, global_state: StateDict) -> StateDict:
        self.retries.streak = 0
        self.work.train.share_memory_()
        self.work.test.share_memory_()
        self.pool = self._new_pool()
        return global_state

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def _restart_pool(self) -> None:
        assert self.pool is not None
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new_pool()

    def _map(
        self, fn_local: Callable, fn_worker: Callable, jobs: list[tuple], *, what: str = "job"
    ) -> list:
        """The jobs' results in submission order. A job lost to a dead worker (the pool
        broken: killed, out of memory, a crash in native code) is run again once, alone, on a
        restarted pool; lost again, its result is None (``what`` "client": the engine counts
        it as dropped) or, for other jobs, an error."""
        assert self.pool is not None, "start() first"
        futures: list[cf.Future | None] = []
        for job in jobs:
            try:
                futures.append(self._submit(fn_worker, job))
            except cf.process.BrokenProcessPool:
                futures.append(None)  # broken while submitting: lost, retried below
        out: list[Any] = [None] * len(jobs)
        lost: list[int] = []
        for i, f in enumerate(futures):
            try:
                if f is None:
                    raise cf.process.BrokenProcessPool
                out[i] = f.result()
                self.retries.streak = 0
            except cf.process.BrokenProcessPool:
                lost.append(i)
        if lost:
            self._restart_pool()
        self.retries.retry(
            jobs,
            out,
            lost,
            what=what,
            how="the pool restarted and each retried once, alone",
            again=lambda i: self._submit(fn_worker, jobs[i]).result(),
            errors=cf.process.BrokenProcessPool,
            recover=self._restart_pool,
        )
        return out

    def _submit(self, fn_worker: Callable, job: tuple) -> cf.Future:
        """``pool.submit``, which spawns a worker when none is idle: the new interpreter
        starts with SIGINT and SIGTERM blocked (``stop_signals_held``), so a Ctrl-C or a
        ``kill`` of the process group while it imports cannot kill it before
        ``init_pool_worker`` ignores them (a worker dead of it would be taken for a crash:
        "a worker process died", its job retried)."""
        assert self.pool is not None, "start() first"
        with stop_signals_held():
            return self.pool.submit(fn_worker, *job)


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread for the block; a process it starts inherits
    the mask (``init_pool_worker`` unblocks them once it ignores them: one that arrived in
    between is dropped). This process gets a held signal when the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
