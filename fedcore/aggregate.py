"""Aggregation math: pure functions over state dicts and weights (Flower's aggregate.py style).

Sums run in float64 in the order given (the engine passes clients in a fixed order), so the
result does not depend on which worker finished first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedcore.payload import StateDict


def normalized_weights(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    return [float(w) / total for w in weights]


def weighted_average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """sum_k w_k * state_k / sum_k w_k per tensor; integer tensors take the maximum.

    Integer tensors are counters such as BatchNorm's ``num_batches_tracked``: an average of
    counters is meaningless, the maximum keeps them monotone.
    """
    if not states:
        raise ValueError("nothing to aggregate")
    w = normalized_weights(weights)
    out: StateDict = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            acc = torch.zeros(ref.shape, dtype=torch.float64)
            for wk, s in zip(w, states, strict=True):
                acc.add_(s[key].to(torch.float64), alpha=wk)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([s[key] for s in states]).amax(dim=0)
    return out


def delta(new: StateDict, old: StateDict) -> StateDict:
    """new - old for floating-point tensors (the client's update)."""
    return {k: new[k] - old[k] for k in new if new[k].is_floating_point()}
