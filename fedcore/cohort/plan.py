"""Which engine runs a configuration, and what a cohort is made of (``fedcore.cohort``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedcore.client import Objective, ObjectiveFn
from fedcore.cohort.util import common_module
from fedcore.errors import ConfigError
from fedcore.protocols import exit_heads, exit_plan

ENGINES = ("auto", "cohort", "sequential")


@dataclass(frozen=True)
class CohortClient:
    """One client of a cohort: what ``train_locally`` gets besides the shared arguments."""

    client_id: int
    indices: np.ndarray
    seed: int
    noise_var: float = 0.0


def resolve_engine(
    name: str,
    device: str,
    model: nn.Module | None = None,
    trainable: frozenset[str] | None = None,
    noise_var: Sequence[float] = (),
) -> str:
    """``runtime.engine`` -> "cohort" or "sequential".

    auto follows the measurements (docs/performance.md): on CPU the cohort engine is faster
    where it caches the frozen part's output: the trained part is one module behind a frozen,
    noise-free path (``head``: 36x per W1 round) or the exit heads of ``lw_linear``/``lw_mlp``
    on a frozen encoder. It is slower where per-client weights run through convolutions
    (``full``, ``lora``, ``residual``: grouped convolutions, larger working sets, layout
    copies). CUDA has not been measured yet, so auto decides the same way there.
    """
    if name not in ENGINES:
        raise ConfigError(f"runtime.engine must be one of {', '.join(ENGINES)} (got {name!r})")
    if name != "auto":
        return name
    if model is None or not trainable or any(v > 0 for v in noise_var):
        return "sequential"
    try:
        check_batchable(model)
    except ConfigError:
        return "sequential"
    if exit_plan(model) is not None:  # cached CLS history: lw_linear, lw_mlp
        return "cohort" if exit_heads(model) is not None else "sequential"
    return "cohort" if common_module(sorted(trainable)) else "sequential"


def check_batchable(model: nn.Module) -> None:
    """The one-line ConfigError for a model the cohort engine cannot batch: random layers in
    training (dropout with p > 0 draws from the global generator, one stream for all clients,
    which a vmapped step cannot reproduce per client)."""
    random = [
        name or type(model).__name__
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
    ]
    if random:
        raise ConfigError(
            f"runtime.engine: cohort cannot batch random layers ({', '.join(random[:3])}: "
            "dropout p > 0); set their dropout to 0 or use runtime.engine: sequential"
        )


def shared_objective(algorithm_name: str, objectives: Sequence[Any]) -> tuple[ObjectiveFn, list]:
    """(the function all clients share, their ctx dicts), or the one-line ConfigError."""
    first = objectives[0]
    if all(isinstance(o, Objective) for o in objectives):
        keys = set(first.ctx)
        if any(set(o.ctx) != keys for o in objectives):
            raise ConfigError(
                f"runtime.engine: cohort: {algorithm_name}'s client objectives carry different "
                "tensors per client; use runtime.engine: sequential"
            )
        return first.fn, [dict(o.ctx) for o in objectives]
    if all(o is first for o in objectives):  # one plain function for every client
        return (lambda logits, y, params, ctx: first(logits, y, params)), [{} for _ in objectives]
    raise ConfigError(
        f"runtime.engine: cohort cannot batch {algorithm_name}: its client_objective returns a "
        "different plain function per client (return fedcore.cohort.Objective, with per-client "
        "tensors in ctx); use runtime.engine: sequential"
    )
