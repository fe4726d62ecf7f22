"""The side of the Ray backend that runs inside the Ray actors (``fedcore.engine.ray_pool``
starts them): a client actor holds one model replica, built once from the run's workload as
a process-pool worker builds its own, and runs ``fedcore.jobs``' client and evaluation jobs;
a cohort actor also trains slices of a round's clients as cohorts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedcore import payload
from fedcore.algorithms.base import ClientTask
from fedcore.engine.backends import CohortBackend, Workload
from fedcore.jobs import ClientResult
from fedcore.payload import StateDict


class ClientActor:
    """One Ray actor: one model replica, serving client and evaluation jobs in turn."""

    def __init__(self, shipped: tuple) -> None:
        from fedcore import jobs, numerics
        from fedcore.device import prepare_cuda

        numerics.apply_inherited()  # the driver's numerics mode, before anything computes
        # The object store hands arrays back read-only (zero copy): the shards (small) are
        # copied so torch.as_tensor can take them as they are.
        names = [f.name for f in dataclasses.fields(Workload) if f.name != "model"]
        args = dict(zip(names, shipped, strict=True))
        args["shards"] = [np.array(s) for s in args["shards"]]
        self.device = str(args["device"])
        if self.device != "cpu":
            prepare_cuda()  # before the first CUDA call, as in the driver
        jobs.init_worker(tuple(args.values())).on_device()  # as the driver's backends do

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
    copy), torch.as_tensor warns on them; a client task's indices, an evaluation's chunk, in
    lists, tuples and dicts (a cohort's tasks and its keyword arguments) too."""
    if isinstance(arg, np.ndarray):
        return arg if arg.flags.writeable else arg.copy()
    if type(arg) in (list, tuple):
        return type(arg)(writable(a) for a in arg)
    if type(arg) is dict:
        return {k: writable(v) for k, v in arg.items()}
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        fields = {f.name: getattr(arg, f.name) for f in dataclasses.fields(arg)}
        arrays = {k: writable(v) for k, v in fields.items() if isinstance(v, np.ndarray)}
        changed = {k: v for k, v in arrays.items() if v is not fields[k]}
        return dataclasses.replace(arg, **changed) if changed else arg
    return arg


COHORT: CohortBackend | None = None  # a cohort actor's backend (set in its own process)


class CohortActor(ClientActor):
    """A client actor that trains cohorts: a ``CohortBackend`` over its model replica (the
    same model serves the evaluation jobs), single-threaded on the CPU as a client actor is."""

    def __init__(
        self,
        shipped: tuple,
        max_clients: int | None,
        trainable: frozenset[str] | None,
    ) -> None:
        global COHORT
        super().__init__(shipped)
        from fedcore import jobs

        assert jobs.WORKER is not None
        COHORT = CohortBackend(jobs.WORKER, max_clients=max_clients, trainable=trainable)
        COHORT.start({})


def cohort_job(
    global_state: StateDict, tasks: list[ClientTask], kwargs: dict[str, Any]
) -> list[ClientResult | None]:
    """A cohort actor's job: ``tasks`` trained as cohorts from ``global_state``
    (``CohortBackend.train`` with the round's keyword arguments for these tasks: a state
    dict among them, such as a download codec's start state, comes as an ObjectRef, put once
    per round), each result's tensors its own, on the host (:func:`materialised`)."""
    import ray

    assert COHORT is not None, "a CohortActor's job"
    device = COHORT.work.device
    kwargs = {
        k: on_device(ray.get(v), device) if isinstance(v, ray.ObjectRef) else v
        for k, v in kwargs.items()
    }
    results = COHORT.train(on_device(global_state, device), tasks, **kwargs)
    return materialised(results)


def on_device(state: StateDict, device: str) -> StateDict:
    return {k: v.to(device) for k, v in state.items()}


def materialised(results: list[ClientResult | None]) -> list[ClientResult | None]:
    """``results`` with every upload and error-feedback memory copied to the host: a
    cohort's uploads are rows (``payload.Row``) of its stacked states, views that would drag
    the actor's device memory or a larger buffer along; each stack is copied once and its
    rows kept, so the server still reduces a cohort's rows in one call per tensor
    (``fedcore.aggregate.stacked``)."""
    stacks: dict[int, dict[str, torch.Tensor]] = {}

    def host(state: Any) -> Any:
        if state is None:
            return None
        if isinstance(state, payload.Row):
            if id(state.stack) not in stacks:
                stacks[id(state.stack)] = {k: host_copy(v) for k, v in state.stack.items()}
            return payload.Row(stacks[id(state.stack)], state.i)
        return {k: host_copy(v) for k, v in state.items()}

    return [
        None if r is None else dataclasses.replace(r, upload=host(r.upload), memory=host(r.memory))
        for r in results
    ]


def host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)
