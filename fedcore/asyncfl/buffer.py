"""FedBuff's server step: pure functions of the buffer, the model versions and the settings
(``fedcore.aggregate``'s style).

Nguyen et al. 2022, Algorithm 1: w <- w + server_lr x sum_i p_i s(tau_i) Delta_i over the B
buffered updates, s the staleness weight; tau_i the versions the model moved since client i
downloaded it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fedcore.aggregate import normalized_weights
from fedcore.asyncfl.config import AsyncConfig
from fedcore.asyncfl.events import Entry
from fedcore.errors import ConfigError
from fedcore.payload import StateDict


def staleness_weight(rule: str, staleness: int, exponent: float = 0.5) -> float:
    """s(tau) of ``federation.async.staleness``: ``constant`` 1, ``inverse_sqrt``
    1 / sqrt(1 + tau) (FedBuff's choice), ``polynomial`` (1 + tau)^-exponent."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0 (got {staleness})")
    if rule == "constant":
        return 1.0
    if rule == "inverse_sqrt":
        return 1.0 / math.sqrt(1.0 + staleness)
    if rule == "polynomial":
        return float((1.0 + staleness) ** -exponent)
    raise ConfigError(
        f"federation.async.staleness must be one of constant, inverse_sqrt, polynomial (got {rule!r})"
    )


def buffered_step(
    global_state: StateDict,
    version: int,
    bases: Mapping[int, StateDict],
    buffer: Sequence[Entry],
    cfg: AsyncConfig,
) -> tuple[StateDict, list[float]]:
    """w + server_lr x sum_i p_i s(tau_i) (x_i - b_i) over the buffer (FedBuff, Algorithm 1;
    x_i: a client's trained tensors, b_i its base version's, p_i its share of the buffer's
    samples or 1/B, tau_i = version - its base version); the weights p_i s(tau_i) back.

    Summed in float64 as w's coefficient form sum_i c_i x_i + sum_v alpha_v b_v, updates first
    in buffer order: with K = B, constant weights, server lr 1 and every base the current
    model, alpha = 0 exactly and the operations are ``fedcore.aggregate.weighted_average``'s,
    so the step is FedAvg's bit for bit. Integer tensors (counters) take the maximum. Keys no
    update holds keep their value.
    """
    if not buffer:
        raise ValueError("nothing to aggregate")
    raw = [float(e.trained.num_samples) if cfg.weighting == "samples" else 1.0 for e in buffer]
    total = float(sum(raw))
    p = normalized_weights(raw)
    lr = cfg.server_lr
    s = [
        staleness_weight(cfg.staleness, version - e.job.base_version, cfg.exponent) for e in buffer
    ]
    coef = [pk * (lr * sk) for pk, sk in zip(p, s, strict=True)]
    alpha: dict[int, float] = {}
    for v in sorted({e.job.base_version for e in buffer} | {version}):
        moved = float(
            sum(
                sk * rk for sk, rk, e in zip(s, raw, buffer, strict=True) if e.job.base_version == v
            )
        )
        alpha[v] = ((total if v == version else 0.0) - lr * moved) / total
    keys = list(buffer[0].trained.update)
    unknown = sorted(set(keys) - set(global_state))
    if unknown or any(e.trained.update.keys() != set(keys) for e in buffer):
        raise ValueError(
            "every buffered update must hold the same keys of the model "
            f"(not in the model: {', '.join(unknown[:4]) or 'none'})"
        )
    out: StateDict = {}
    for key in keys:
        ref = global_state[key]
        if not ref.is_floating_point():
            out[key] = torch.stack([ref, *(e.trained.update[key] for e in buffer)]).amax(dim=0)
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for c, e in zip(coef, buffer, strict=True):
            acc.add_(e.trained.update[key].to(torch.float64), alpha=c)
        for v, a in alpha.items():
            if a != 0.0:
                base = global_state if v == version else bases[v]
                acc.add_(base[key].to(torch.float64), alpha=a)
        out[key] = acc.to(ref.dtype)
    return {**global_state, **out}, [pk * sk for pk, sk in zip(p, s, strict=True)]
