"""Early-exit models in the engine (seed 001 §5: anytime and multi-tier FL).

A model with early exits carries an ``exit_plan`` (``fedcore.protocols.ExitPlan``): the
engine tells it whose local training starts (:func:`begin_client`: the client's tier and its
anytime stream, from the client's derived seed) and evaluates every exit in one pass
(:func:`evaluate_exits`). Models without exits are untouched (FedAvg's path is unchanged).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedcore.client import split_state
from fedcore.payload import StateDict
from fedcore.protocols import exit_plan


def num_exits(model: nn.Module) -> int:
    plan = exit_plan(model)
    return 0 if plan is None else int(plan.num_exits)


def begin_client(model: nn.Module, client_id: int, seed: int) -> None:
    plan = exit_plan(model)
    if plan is not None:
        plan.begin_client(client_id, seed)


def client_exit(model: nn.Module, client_id: int) -> int | None:
    """The exit fixed for client ``client_id`` (None: no early exits): its tier in multi-tier
    FL (``tiers[c % len(tiers)]``), else the inference exit (``exit``, default the last).
    Seed 001 App. A: a client's exit "should be persistently fixed in both training and
    testing", and personalization fine-tunes "with a predefined exit layer"."""
    plan = exit_plan(model)
    if plan is None:
        return None
    tiers = getattr(plan, "tiers", ())  # multi-tier plans (``models.adapters.exits``)
    if getattr(plan, "mode", "last") == "multitier" and tiers:
        return int(tiers[client_id % len(tiers)])
    return plan.num_exits - 1 if plan.exit is None else int(plan.exit)


@contextmanager
def fixed_exit(model: nn.Module, k: int | None) -> Iterator[None]:
    """Every forward call inside ends at exit ``k``, training and evaluation alike (nothing
    for ``k`` None or a model without exits); the plan is restored on leaving."""
    plan = exit_plan(model)
    if plan is None or k is None:
        yield
        return
    saved = (plan.forced, plan.exit)
    plan.forced, plan.exit = int(k), int(k)
    try:
        yield
    finally:
        plan.forced, plan.exit = saved


@torch.no_grad()
def evaluate_exits(
    model: nn.Module,
    state: StateDict,
    data,  # ImageData or TextData: ``batch(positions, device=...)``
    indices: np.ndarray | None = None,
    *,
    batch_size: int = 500,
    device: torch.device | str = "cpu",
) -> tuple[int, float, int, tuple[int, ...]]:
    """(correct at the inference exit, its summed cross-entropy, samples, correct per exit)."""
    plan = exit_plan(model)
    assert plan is not None, "evaluate_exits needs a model with early exits"
    model.eval()
    idx = torch.arange(len(data)) if indices is None else torch.as_tensor(indices)
    params, buffers = split_state(model, {k: v.to(device) for k, v in state.items()})
    chosen = plan.num_exits - 1 if plan.exit is None else plan.exit
    per_exit = [0] * plan.num_exits
    correct, loss_sum = 0, 0.0
    saved = (plan.output, plan.exit)
    plan.output, plan.exit = "all", None  # run every block, return every exit
    try:
        for pos in idx.split(batch_size):
            x, y = data.batch(pos, device=device)
            logits = functional_call(model, (params, buffers), (x,))  # (E, B, C)
            hits = logits.argmax(dim=2) == y  # (E, B)
            for k in range(plan.num_exits):
                per_exit[k] += int(hits[k].sum())
            loss_sum += float(nn.functional.cross_entropy(logits[chosen], y, reduction="sum"))
            correct += int(hits[chosen].sum())
    finally:
        plan.output, plan.exit = saved
    return correct, loss_sum, int(idx.numel()), tuple(per_exit)
