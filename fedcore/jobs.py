"""The work a client or an evaluator does, in this process or in a worker process.

A job decodes what it receives, runs, and encodes what it sends back: the wire on both sides.
A worker process builds its model once (``init_worker``) and serves every client after it,
and dies with the process that started it (``init_pool_worker``). What the server makes of a
client's upload, whichever engine trained it, is a :class:`ClientResult`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcore import numerics, payload
from fedcore.algorithms.base import (
    MESSAGE,
    UPLOAD,
    ClientTask,
    ClientUpdate,
    ClientView,
    FederatedAlgorithm,
)
from fedcore.client import ImageData, LocalConfig, evaluate, train_locally
from fedcore.codecs import Codecs, decode_state, decode_update, encode_update, float_dtype
from fedcore.exits import begin_client, evaluate_exits, num_exits
from fedcore.payload import StateDict


@dataclass(frozen=True)
class Workload:
    """What the clients train and evaluate on, fixed for the run: the run's model and data.
    The engine's backends hold the run's; a worker process (of the pool, or a Ray actor)
    holds its own, sent without the model (:meth:`shipped`), its model built there
    (:meth:`built`)."""

    model_fn: Callable[[], nn.Module]  # builds a worker process's own model
    model: nn.Module  # this process's one model instance (the initial global model's)
    algorithm: FederatedAlgorithm
    train: ImageData
    test: ImageData
    shards: Sequence[np.ndarray]
    noise_var: Sequence[float]
    local: LocalConfig
    device: str
    codecs: Codecs = Codecs()  # how uploads and downloads are encoded (none: float32)

    def shipped(self) -> tuple[Any, ...]:
        """What a worker process is sent: every field but the model, which it builds."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model")

    @classmethod
    def built(cls, shipped: Sequence[Any]) -> Workload:
        """A worker process's workload from what it was sent: its own model built here."""
        model_fn, *rest = shipped
        return cls(model_fn, model_fn(), *rest)

    def on_device(self) -> Workload:
        """This workload with its model moved (in place) to its device."""
        self.model.to(self.device)
        return self


WORKER: Workload | None = None

# What a client job sends back (:func:`client_job`): (client, encoded upload, samples, steps,
# loss, seconds, error-feedback memory). The upload is bytes on the wire, decoded by the server
# (:func:`receive`); the memory (encoded, None without one) is the client's own state, kept
# for its next round by the simulation, not sent and not counted.
Wire = tuple[int, bytes, int, int, float, float, bytes | None]


@dataclass(frozen=True, slots=True)
class ClientResult:
    """One client's round as the server receives it, whichever engine trained it: the
    sequential and process-pool engines decode a :data:`Wire` (:func:`receive`), the cohort
    engine reads its cohort's stacked states (``fedcore.cohort.round``). Picklable."""

    client_id: int
    # The uploaded tensors (every key, or the plan's upload_keys); from the cohort engine a
    # ``payload.Row`` of its cohort's stacked states (read-only, read like a state dict).
    upload: StateDict
    upload_bytes: int  # len(payload.encode(upload)): the bytes on the wire
    num_samples: int
    num_steps: int
    train_loss: float
    seconds: float  # the client's local training time
    finite: bool  # no NaN/Inf in the upload (else the server rejects it)
    # the client's error-feedback memory after this round (``fedcore.codecs``): client state,
    # not on the wire; None without a codec that keeps one
    memory: StateDict | None = None

    def update(self) -> ClientUpdate:
        """What the algorithm aggregates (an accepted upload's)."""
        return ClientUpdate(
            self.client_id,
            self.upload,
            self.num_samples,
            self.num_steps,
            self.train_loss,
            self.upload_bytes,
        )


def receive(
    wire: Wire, codecs: Codecs | None = None, global_state: StateDict | None = None
) -> ClientResult:
    """The server's side of a client job: its upload decoded, counted and checked finite.
    Through an upload codec the upload is the client's encoded update, decoded and applied to
    the server's ``global_state`` (``fedcore.codecs.decode_update``)."""
    client_id, upload, num_samples, num_steps, train_loss, seconds, memory = wire
    state = payload.decode(upload)
    if codecs is not None and codecs.upload is not None:
        assert global_state is not None, "an upload codec decodes against the global model"
        state = decode_update(codecs.upload, state, global_state, UPLOAD, codecs.raw)
    return ClientResult(
        client_id,
        state,
        len(upload),
        num_samples,
        num_steps,
        train_loss,
        seconds,
        payload.is_finite(state),
        None if memory is None else payload.decode(memory),
    )


def init_worker(shipped: Sequence[Any]) -> Workload:
    """This worker process's workload (:meth:`Workload.built`), one thread."""
    global WORKER
    torch.set_num_threads(1)
    WORKER = Workload.built(shipped)
    return WORKER


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, poll_seconds: float = 1.0) -> None:
    """End this process when ``parent`` (the process that started it) dies, even by kill -9:
    on Linux the kernel sends SIGKILL at once (prctl PR_SET_PDEATHSIG; it fires when the
    parent *thread* that spawned this process ends, and the engine's pool lives and dies in
    one thread); everywhere a daemon thread also checks every ``poll_seconds`` that the
    parent is still this process's parent (reparented: it died) and exits."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watchdog alone
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="fedapt-parent-watchdog", daemon=True).start()


def init_pool_worker(parent: int, shipped: Sequence[Any]) -> None:
    """A worker of the engine's pool: dies with ``parent``, ignores SIGINT and SIGTERM, then
    :func:`init_worker`. A Ctrl-C or a ``kill`` of the run's process group reaches the
    workers too: the parent stops (and its workers with it); a worker that died of the same
    signal first would be taken for a crash (its jobs lost and retried, said on stderr)."""
    die_with_parent(parent)
    stop_signals = (signal.SIGINT, signal.SIGTERM)
    for sig in stop_signals:
        signal.signal(sig, signal.SIG_IGN)
    # the pool starts its workers with both blocked (engine.pool.stop_signals_held), so one
    # sent while this interpreter was starting is still pending: ignored now, it is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    numerics.apply_inherited()  # the parent's numerics mode, before anything computes
    init_worker(shipped)


def client_job(
    ctx: Workload,
    task: ClientTask,
    lr: float,
    seed: int,
    download: bytes,
    held: bytes | None,
    max_steps: int | None = None,
    memory: bytes | None = None,
) -> Wire:
    """Decode the download, train locally, encode the upload: the wire on both sides.

    ``held`` is what the client already holds from earlier rounds (FedNILO's frozen layers):
    it never crosses the wire this round, so its bytes are not counted. ``max_steps``: a
    straggler's partial update, cut after that many local steps (the first steps of the
    same batch order; None: the configured local training). ``memory``: the client's
    error-feedback memory from its last round (encoded; ``fedcore.codecs``).
    """
    local = ctx.local
    if max_steps is not None:
        cap = max_steps if local.max_steps is None else min(max_steps, local.max_steps)
        local = dataclasses.replace(local, max_steps=cap)
    received = payload.decode(download)
    codecs = ctx.codecs
    if codecs.download is not None:  # weights through the download codec
        received = decode_state(codecs.download, received, _model_dtype(ctx.model), codecs.raw)
    message = {k[len(MESSAGE) :]: v for k, v in received.items() if k.startswith(MESSAGE)}
    state = {k: v for k, v in received.items() if not k.startswith(MESSAGE)}
    if held is not None:
        merged = {**payload.decode(held), **state}
        state = {k: merged[k] for k in ctx.model.state_dict()}  # the model's key order
    own = torch.as_tensor(ctx.shards[task.client_id], dtype=torch.int64)
    view = ClientView(
        labels=ctx.train.labels.index_select(0, own), message=message, private=task.private
    )
    begin_client(ctx.model, task.client_id, seed)  # early exits: tier, anytime stream
    res = train_locally(
        ctx.model,
        state,
        ctx.train,
        task.indices,
        lr=lr,
        cfg=local,
        seed=seed,
        noise_var=ctx.noise_var[task.client_id],
        loss_fn=ctx.algorithm.client_objective(state, view),
        device=ctx.device,
        trainable=task.trainable,
    )
    out = res.state if task.upload_keys is None else {k: res.state[k] for k in task.upload_keys}
    extra = ctx.algorithm.client_upload(
        state, res.state, view, num_steps=res.num_steps, lr=lr, local=local
    )
    extras = {UPLOAD + k: v for k, v in extra.items()}
    kept = None
    if ctx.codecs.upload is not None:  # the update through the upload codec
        enc = encode_update(
            ctx.codecs.upload,
            state,
            out,
            extras,
            seed=seed,
            memory=None if memory is None else payload.decode(memory),
            raw=ctx.codecs.raw,
        )
        upload = payload.encode(enc.wire)
        kept = None if enc.memory is None else payload.encode(enc.memory)
    else:
        upload = payload.encode({**out, **extras})
    return (
        task.client_id, upload, res.num_samples, res.num_steps, res.train_loss, res.seconds,
        kept,
    )  # fmt: skip


def _model_dtype(model: nn.Module) -> torch.dtype:
    return float_dtype(dict(model.state_dict()))


def eval_job(
    ctx: Workload, state_bytes: bytes, indices: np.ndarray
) -> tuple[int, float, int, tuple[int, ...]]:
    """(correct, summed loss, samples, correct per early exit: () without exits)."""
    return eval_state(ctx, payload.decode(state_bytes), indices)


def eval_state(
    ctx: Workload, state: StateDict, indices: np.ndarray
) -> tuple[int, float, int, tuple[int, ...]]:
    if num_exits(ctx.model):
        return evaluate_exits(ctx.model, state, ctx.test, indices, device=ctx.device)
    return (*evaluate(ctx.model, state, ctx.test, indices, device=ctx.device), ())


def worker_client_job(*args: Any) -> Wire:
    assert WORKER is not None
    return client_job(WORKER, *args)


def worker_eval_job(*args: Any) -> tuple[int, float, int, tuple[int, ...]]:
    assert WORKER is not None
    return eval_job(WORKER, *args)
