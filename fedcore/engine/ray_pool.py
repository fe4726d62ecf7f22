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

With the cohort engine (``runtime.engine: cohort``), :class:`RayCohortBackend`: each actor
also holds a ``CohortBackend`` over its replica and trains a contiguous slice of the round's
clients, in sampling order, as a cohort (:class:`CohortActor`); evaluation stays the wire's
evaluation jobs. A slice is the unit of retry: lost twice, its clients are counted as crashed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fedcore.algorithms.base import ClientTask
from fedcore.cohort import check_batchable
from fedcore.engine.backends import (
    Placement,
    Retries,
    WireBackend,
    Workload,
    job_clients,
)
from fedcore.engine.ray_actors import ClientActor, CohortActor, cohort_job
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
from fedcore.events import Callback, RoundRecord
from fedcore.jobs import ClientResult
from fedcore.payload import StateDict

START_SECONDS = 180.0  # how long the actors may take to start before it is one line


class RayBackend(WireBackend):
    """Ray actors, each serving clients one after another (``settings.actors`` of them, or
    what the cluster holds, at most ``clients`` the round's)."""

    actor_class: type = ClientActor

    @classmethod
    def create(cls, work: Workload, where: Placement) -> RayBackend:
        assert where.ray is not None, "a Ray backend needs Ray's settings"
        return cls(work, where.ray, where.clients_per_round)

    def nodes(self) -> ClientNodes:
        return ClientNodes(self)

    def __init__(self, work: Workload, settings: RaySettings, clients: int) -> None:
        self.work = work
        self.settings = settings
        self.clients = clients
        self.actors: list[Any] = []
        self._remote: Any = None  # ray.remote(ClientActor), with its options
        self._context: Any = None  # the context's ObjectRef: put once per run
        self._owns_ray = False  # this backend initialised Ray: it shuts it down
        self.retries = Retries("Ray actor", "Ray actors")
        # What the tests and the docs' claims check: per client job in job order, (client,
        # Ray node id); per _map call, how many objects went into the object store.
        self.placements: list[tuple[int, str]] = []
        self.puts: list[int] = []
        self.node_addresses: dict[str, str] = {}  # Ray node id -> its IP (at start)

    # ---- start and stop ------------------------------------------------------------------
    def start(self, global_state: StateDict) -> StateDict:
        ray = ray_module()
        self.retries.streak = 0
        self._owns_ray = connect(self.settings)
        try:
            nodes = node_resources()
            self.node_addresses.update(
                (str(n["NodeID"]), str(n.get("NodeManagerAddress", "?")))
                for n in ray.nodes()
                if n.get("Alive")
            )
            check_gpus(self.settings, self.work.device, nodes)
            count = actor_count(self.settings, self.clients, nodes)
            self._context = ray.put(self.work.shipped())
            self._remote = ray.remote(self.actor_class).options(
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
        return self._remote.remote(self._context)

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
        """The jobs with every bytes argument (a download, the evaluated state) and every
        state dict (a cohort's global state) replaced by its ObjectRef: each distinct object
        put once, however many jobs share it."""
        ray = ray_module()
        refs: dict[int, Any] = {}
        out = []
        for job in jobs:
            args = []
            for a in job:
                if isinstance(a, bytes) or is_state(a):
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
        actor; lost again, its result is None (``what`` "client" or "cohort": the engine
        counts its clients as dropped) or, for other jobs, an error."""
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
                    self.retries.streak = 0
                except RayActorError:
                    lost.append(i)
                    self.actors[a] = self._new_actor()  # a restarted actor in its slot
                idle.append(a)
        self.retries.retry(
            jobs,
            out,
            lost,
            what=what,
            how="each retried once, alone, on a restarted actor",
            again=lambda i: self._again(fn_worker, sent[i], nodes, i),
            errors=RayActorError,
            recover=self._restart_first,
        )
        for i in range(len(jobs)):
            if i in nodes:
                self.placements.extend((c, nodes[i]) for c in job_clients(what, jobs[i]))
        return out

    def _again(self, fn_worker: Callable, job: tuple, nodes: dict[int, str], i: int) -> Any:
        """Job ``i`` run again, alone, on the first actor; its node into ``nodes``."""
        res, nodes[i] = ray_module().get(self.actors[0].run.remote(fn_worker, *job))
        return res

    def _restart_first(self) -> None:
        self.actors[0] = self._new_actor()


class ClientNodes(Callback):
    """Which Ray node trained each client: (round, client, node id) per trained client, in
    task order, from the backend's placements as each round ends; the nodes' addresses in
    :meth:`to_dict`. Not part of any result: placement is Ray's choice (the run's bytes do
    not depend on it), recorded beside the times (``timing.json``)."""

    def __init__(self, backend: RayBackend) -> None:
        self.backend = backend
        self.rows: list[tuple[int, int, str]] = []
        self._seen = len(backend.placements)

    def on_fit_start(self, info: dict[str, Any]) -> None:
        self._seen = len(self.backend.placements)

    def on_round_end(self, record: RoundRecord) -> None:
        new = self.backend.placements[self._seen :]
        self._seen = len(self.backend.placements)
        self.rows.extend((record.round, client, node) for client, node in new)

    def to_dict(self) -> dict[str, Any]:
        """``{"nodes": {node id: address}, "clients": [[round, client, node id], ...]}``."""
        used = sorted({node for _, _, node in self.rows})
        return {
            "nodes": {n: self.backend.node_addresses.get(n, "?") for n in used},
            "clients": [list(row) for row in self.rows],
        }


def is_state(arg: Any) -> bool:
    """A state dict (name -> tensor): a cohort's global state."""
    return (
        type(arg) is dict
        and bool(arg)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in arg.items())
    )


class RayCohortBackend(RayBackend):
    """The cohort engine on Ray actors (``runtime.engine: cohort``, ``runtime.clients:
    ray``): the round's training tasks are cut, in sampling order, into contiguous slices
    (``cohort_size`` tasks each when set, else one slice per actor), each trained as cohorts
    by one actor's ``CohortBackend`` (:class:`CohortActor`); the results are gathered in task
    order. The global state goes into the object store once per round, the clients' uploads
    come back as host tensors (each cohort's stack copied once). Evaluation: the wire's
    evaluation jobs, as :class:`RayBackend`'s.

    With ``cohort_size`` set the slices do not depend on the number of actors, so neither
    do the results: the same cohorts as the local cohort engine with that ``cohort_size``.
    Without it, the cohorts (and so the last bits of float arithmetic) follow the actor count.
    """

    encodes = False  # as the local cohort engine: the clients read the global state
    actor_class = CohortActor

    @classmethod
    def create(cls, work: Workload, where: Placement) -> RayCohortBackend:
        assert where.ray is not None, "a Ray backend needs Ray's settings"
        return cls(work, where.ray, where.clients_per_round, where.cohort_size, where.trainable)

    def __init__(
        self,
        work: Workload,
        settings: RaySettings,
        clients: int,
        cohort_size: int | None = None,
        trainable: frozenset[str] | None = None,
    ) -> None:
        check_batchable(work.model)  # the local cohort engine's one line, before Ray starts
        super().__init__(work, settings, clients)
        self.cohort_size = cohort_size
        self.trainable = trainable

    def _new_actor(self) -> Any:
        return self._remote.remote(self._context, self.cohort_size, self.trainable)

    def slices(self, n: int, actors: int) -> list[slice]:
        """The round's ``n`` training tasks cut into contiguous slices, in sampling order:
        of ``cohort_size`` tasks, else one per actor (``actors`` of them)."""
        size = self.cohort_size or -(-n // max(1, actors))
        return [slice(lo, min(n, lo + size)) for lo in range(0, n, size)]

    def train(
        self, global_state: StateDict, tasks: Sequence[ClientTask], **kwargs: Any
    ) -> list[ClientResult | None]:
        """``Backend.train``: its keyword arguments are passed on to each actor's
        ``CohortBackend.train`` as they are, those holding one entry per task (a list or a
        tuple as long as ``tasks``: seeds, step caps, downloads, error-feedback memories) cut
        with the tasks, a state dict (a download codec's start state) put once."""
        n = len(tasks)
        if not n:
            return []
        per_task = {k for k, v in kwargs.items() if type(v) in (list, tuple) and len(v) == n}
        ray = ray_module()
        kwargs = {k: ray.put(v) if is_state(v) else v for k, v in kwargs.items()}
        cuts = self.slices(n, len(self.actors))
        jobs = [
            (
                global_state,
                list(tasks[s]),
                {k: v[s] if k in per_task else v for k, v in kwargs.items()},
            )
            for s in cuts
        ]
        parts = self._map(cohort_job, cohort_job, jobs, what="cohort")
        self.puts[-1] += sum(isinstance(v, ray.ObjectRef) for v in kwargs.values())
        out: list[ClientResult | None] = []
        for s, part in zip(cuts, parts, strict=True):
            out.extend([None] * (s.stop - s.start) if part is None else part)
        return out
