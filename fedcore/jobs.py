"""The work a client or an evaluator does, in this process or in a worker process.

A job decodes what it receives, runs, and encodes what it sends back: the wire on both sides.
A worker process builds its model once (``init_worker``) and serves every client after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms.base import ClientTask, ClientView, FederatedAlgorithm
from fedcore.client import ImageData, LocalConfig, evaluate, train_locally
from fedcore.exits import begin_client, evaluate_exits, num_exits
from fedcore.payload import StateDict
from fedcore.wire import MESSAGE


@dataclass
class Context:
    model: nn.Module
    algorithm: FederatedAlgorithm
    train: ImageData
    test: ImageData
    shards: Sequence[np.ndarray]
    noise_var: Sequence[float]
    local: LocalConfig
    device: str


WORKER: Context | None = None


def init_worker(model_fn: Callable[[], nn.Module], *args: Any) -> None:
    global WORKER
    torch.set_num_threads(1)
    WORKER = Context(model_fn(), *args)


def client_job(
    ctx: Context, task: ClientTask, lr: float, seed: int, download: bytes, held: bytes | None
) -> tuple[int, bytes, int, int, float, float]:
    """Decode the download, train locally, encode the upload: the wire on both sides.

    ``held`` is what the client already holds from earlier rounds (FedNILO's frozen layers):
    it never crosses the wire this round, so its bytes are not counted.
    """
    received = payload.decode(download)
    message = {k[len(MESSAGE) :]: v for k, v in received.items() if k.startswith(MESSAGE)}
    state = {k: v for k, v in received.items() if not k.startswith(MESSAGE)}
    if held is not None:
        merged = {**payload.decode(held), **state}
        state = {k: merged[k] for k in ctx.model.state_dict()}  # the model's key order
    own = torch.as_tensor(ctx.shards[task.client_id], dtype=torch.int64)
    view = ClientView(labels=ctx.train.labels.index_select(0, own), message=message)
    begin_client(ctx.model, task.client_id, seed)  # early exits: tier, anytime stream
    res = train_locally(
        ctx.model,
        state,
        ctx.train,
        task.indices,
        lr=lr,
        cfg=ctx.local,
        seed=seed,
        noise_var=ctx.noise_var[task.client_id],
        loss_fn=ctx.algorithm.client_objective(state, view),
        device=ctx.device,
        trainable=task.trainable,
    )
    out = res.state if task.upload_keys is None else {k: res.state[k] for k in task.upload_keys}
    upload = payload.encode(out)
    return task.client_id, upload, res.num_samples, res.num_steps, res.train_loss, res.seconds


def eval_job(
    ctx: Context, state_bytes: bytes, indices: np.ndarray
) -> tuple[int, float, int, tuple[int, ...]]:
    """(correct, summed loss, samples, correct per early exit: () without exits)."""
    return eval_state(ctx, payload.decode(state_bytes), indices)


def eval_state(
    ctx: Context, state: StateDict, indices: np.ndarray
) -> tuple[int, float, int, tuple[int, ...]]:
    if num_exits(ctx.model):
        return evaluate_exits(ctx.model, state, ctx.test, indices, device=ctx.device)
    return (*evaluate(ctx.model, state, ctx.test, indices, device=ctx.device), ())


def worker_client_job(*args: Any) -> tuple[int, bytes, int, int, float, float]:
    assert WORKER is not None
    return client_job(WORKER, *args)


def worker_eval_job(*args: Any) -> tuple[int, float, int, tuple[int, ...]]:
    assert WORKER is not None
    return eval_job(WORKER, *args)
