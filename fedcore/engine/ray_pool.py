"""The Ray backend: a round's clients train on a pool of Ray actors (``runtime.clients: ray``).

Each actor is a worker process of the Ray cluster holding one model replica, built once from
the picklable ``model_fn`` and the run's context (as a process-pool worker builds its own:
``fedcore.jobs.init_worker``), single-threaded on the CPU, in the numerics mode of this
process. It runs ``fedcore.jobs``' client and evaluation jobs, bytes in, bytes out: the same
jobs as the process pool, so the same bytes come back.

What travels: the run's context (data, shards, algorithm) goes into the object store once per
run; each round's encoded global model (every distinct download, and the evaluation's state)
once per round (``ray.put``), whatever the number of clients; uploads come back through the
object store. Results are gathered in job order, whatever order the actors finish in, so
aggregation stays in sampling order.

A job lost to a dead actor (killed, out of memory, its node gone) is run again once, alone, on
a restarted actor; lost again, the client is counted as dropped, as with the process pool
(``fedcore.engine.pool``). Ray is imported lazily: fedcore imports without it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from fedcore.engine.backends import WireBackend, Workload
from fedcore.engine.ray_cluster import (
    RaySettings,
    actor_count,
    actor_env,
    check_gpus,
    connect,
    node_resources,
    ray_module,
)
from fedcore.errors import ConfigError
from fedcore.payload import StateDict

START_SECONDS = 180.0  # how long the actors may take to start before it is one line


class ClientActor:
    """One Ray actor: one model replica, serving client and evaluation jobs in turn."""

    def __init__(self, model_fn: Callable, context_args: tuple) -> None:
        from fedcore import jobs, numerics
        from fedcore.device import prepare_cuda

        numerics.apply_inherited()  # the driver's numerics mode, before anything computes
        # The object store hands arrays back read-only (zero copy): the shards (Workload.
        # context_args()[3], small) are copied so torch.as_tensor can take them as they are.
        args = list(context_args)
        args[3] = [np.array(s) for s in args[3]]
        self.device = str(args[-1])  # Workload.context_args() ends with the device
        if self.device != "cpu":
            prepare_cuda()  # before the first CUDA call, as in the driver
        jobs.init_worker(model_fn, *args)
        assert jobs.WORKER is not None
        jobs.WORKER.model.to(self.device)  # as Workload.context() does in this process

    def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def run(self, fn: Callable, *job: Any) -> tuple[Any, str]:
        """``fn(*job)`` (a ``fedcore.jobs`` worker job) and the node it ran on."""
        from fedcore.device import deterministic

        with deterministic(self.device):  # CUDA: the driver's deterministic settings
            return fn(*(writable(a) for a in job)), self.node()


def writable(arg: Any) -> Any:
    """``arg`` with its read-only arrays copied: Ray hands arrays to an actor read-only (zero
    copy), torch.as_tensor warns on them; a client task's indices, an evaluation's chunk."""
    if isinstance(arg, np.ndarray):
        return arg if arg.flags.writeable else arg.copy()
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        fields = {f.name: getattr(arg, f.name) for f in dataclasses.fields(arg)}
        arrays = {k: writable(v) for k, v in fields.items() if isinstance(v, np.ndarray)}
        changed = {k: v for k, v in arrays.items() if v is not fields[k]}
        return dataclasses.replace(arg, **changed) if changed else arg
    return arg


class RayBackend(WireBackend):
    """Ray actors, each serving clients one after another (``settings.actors`` of them, or
    what the cluster holds, at most ``clients`` the round's)."""

    def __init__(self, work: Workload, settings: RaySettings, clients: int) -> None:
        self.work = work
        self.settings = settings
        self.clients = clients
        self.actors: list[Any] = []
        self._remote: Any = None  # ray.remote(ClientActor), with its options
        self._context: Any = None  # the context's ObjectRef: put once per run
        self._owns_ray = False  # this backend initialised Ray: it shuts it down
        self._lost_streak = 0
        # What the tests and the docs' claims check: per client job in job order, (client,
        # Ray node id); per _map call, how many objects went into the object store.
        self.placements: list[tuple[int, str]] = []
        self.puts: list[int] = []

    # ---- start and stop ------------------------------------------------------------------
    def start(self, global_state: StateDict) -> StateDict:
        ray = ray_module()
        self._lost_streak = 0
        self._owns_ray = connect(self.settings)
        try:
            nodes = node_resources()
            check_gpus(self.settings, self.work.device, nodes)
            count = actor_count(self.settings, self.clients, nodes)
            self._context = ray.put(self.work.context_args())
            self._remote = ray.remote(ClientActor).options(
                num_cpus=self.settings.actor_cpus,
                num_gpus=self.settings.actor_gpus,
                max_restarts=0,
                scheduling_strategy="SPREAD",
                runtime_env={"env_vars": actor_env()},
            )
            self.actors = [self._new_actor() for _ in range(count)]
            self._probe()
        except BaseException:
            self.close()
            raise
        return global_state

    def _new_actor(self) -> Any:
        return self._remote.remote(self.work.model_fn, self._context)

    def _probe(self) -> None:
        """Every actor up (its model built) before training: one line where one cannot start
        (its Python cannot import fedapt, its model fails) or the cluster cannot place them."""
        ray = ray_module()
        from ray.exceptions import GetTimeoutError, RayActorError

        where = (
            f"the Ray cluster at {self.settings.address}" if self.settings.address else "local Ray"
        )
        try:
            ray.get([a.node.remote() for a in self.actors], timeout=START_SECONDS)
        except GetTimeoutError as err:
            raise ConfigError(
                f"runtime.ray_actors: {len(self.actors)} client actors of "
                f"{self.settings.actor_cpus:g} CPU and {self.settings.actor_gpus:g} GPU did not "
                f"start within {START_SECONDS:g} s on {where}; ask for fewer or smaller actors"
            ) from err
        except RayActorError as err:
            lines = [s.strip() for s in str(err).splitlines() if "Error" in s and s.strip()]
            cause = lines[-1] if lines else type(err).__name__
            raise ConfigError(
                f"runtime.clients: ray: a client actor could not start on {where} ({cause}); "
                f"every node's Python must import fedapt (this checkout, constraints.txt)"
            ) from err

    def close(self) -> None:
        ray = sys.modules.get("ray")
        if ray is None:
            return
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self._remote, self._context = [], None, None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    # ---- the jobs ------------------------------------------------------------------------
    def _put(self, jobs: list[tuple]) -> list[tuple]:
        """The jobs with every bytes argument (a download, the evaluated state) replaced by
        its ObjectRef: each distinct object put once, however many jobs share it."""
        ray = ray_module()
        refs: dict[int, Any] = {}
        out = []
        for job in jobs:
            args = []
            for a in job:
                if isinstance(a, bytes):
                    if id(a) not in refs:
                        refs[id(a)] = ray.put(a)
                    a = refs[id(a)]
                args.append(a)
            out.append(tuple(args))
        self.puts.append(len(refs))
        return out

    def _map(
        self, fn_local: Callable, fn_worker: Callable, jobs: list[tuple], *, what: str = "job"
    ) -> list:
        """The jobs' results in submission order, each actor taking the next job as it
        finishes one. A job lost to a dead actor is run again once, alone, on a restarted
        actor; lost again, its result is None (``what`` "client": the engine counts it as
        dropped) or, for other jobs, an error."""
        ray = ray_module()
        from ray.exceptions import RayActorError

        assert self.actors, "start() first"
        sent = self._put(jobs)
        out: list[Any] = [None] * len(jobs)
        nodes: dict[int, str] = {}
        lost: list[int] = []
        todo = list(range(len(jobs)))[::-1]  # popped from the end: job order
        running: dict[Any, tuple[int, int]] = {}  # ref -> (job, actor slot)
        idle = list(range(len(self.actors)))
        while todo or running:
            while todo and idle:
                i, a = todo.pop(), idle.pop(0)
                running[self.actors[a].run.remote(fn_worker, *sent[i])] = (i, a)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                i, a = running.pop(ref)
                try:
                    out[i], nodes[i] = ray.get(ref)
                    self._lost_streak = 0
                except RayActorError:
                    lost.append(i)
                    self.actors[a] = self._new_actor()  # a restarted actor in its slot
                idle.append(a)
        if lost:
            print(
                f"fedapt: a Ray actor died; {len(lost)} {what} job(s) lost, each retried "
                f"once, alone, on a restarted actor",
                file=sys.stderr,
                flush=True,
            )
        for i in sorted(lost):
            try:
                out[i], nodes[i] = ray.get(self.actors[0].run.remote(fn_worker, *sent[i]))
                self._lost_streak = 0
                continue
            except RayActorError:
                self.actors[0] = self._new_actor()
            self._lost_streak += 1
            # An actor that cannot start (its model fails) loses every job: stop then.
            if what != "client" or self._lost_streak >= 3:
                raise RuntimeError(
                    f"Ray actors died on {self._lost_streak} {what} job(s) in a row, each "
                    f"retried once: giving up (an actor's own error, if any, is above)"
                )
            client = getattr(jobs[i][0], "client_id", "?")
            print(
                f"fedapt: client {client} dropped: its Ray actor died again on the retry",
                file=sys.stderr,
                flush=True,
            )
        if what == "client":
            self.placements.extend(
                (jobs[i][0].client_id, nodes[i]) for i in range(len(jobs)) if i in nodes
            )
        return out
