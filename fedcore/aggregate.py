"""Aggregation math: pure functions over state dicts and weights (Flower's aggregate.py style).

Sums run in float64 in the order given (the engine passes clients in a fixed order), so the
result does not depend on which worker finished first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
            acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
            for wk, s in zip(w, states, strict=True):
                acc.add_(s[key].to(torch.float64), alpha=wk)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([s[key] for s in states]).amax(dim=0)
    return out


def delta(new: StateDict, old: StateDict) -> StateDict:
    """new - old for floating-point tensors (the client's update)."""
    return {k: new[k] - old[k] for k in new if new[k].is_floating_point()}


def sgd_normalizer(num_steps: int, momentum: float = 0.0) -> float:
    """FedNova's a_i = ||a_i||_1 for tau_i local SGD steps (Wang et al. 2020, seed 000 [12]).

    Plain SGD: a_i = tau_i. Heavy-ball momentum rho: every gradient keeps acting through the
    momentum buffer, a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho).
    """
    if momentum == 0.0:
        return float(num_steps)
    rho = momentum
    return (num_steps - rho * (1.0 - rho**num_steps) / (1.0 - rho)) / (1.0 - rho)


def normalized_average(
    global_state: StateDict,
    states: Sequence[StateDict],
    weights: Sequence[float],
    normalizers: Sequence[float],
    param_keys: Iterable[str],
) -> StateDict:
    """FedNova's update: w - tau_eff * sum_i p_i (w - w_i) / a_i, tau_eff = sum_i p_i a_i.

    Only trainable parameters are normalized: BatchNorm running statistics are not the sum
    of gradient steps, and dividing them by a_i is what turns a model non-finite (seed 000
    §IV-A3); they and the integer counters take the sample-weighted average
    (``weighted_average``). Clients with a_i = 0 (no local step) contribute no update.
    """
    out = weighted_average(states, weights)
    p = normalized_weights(weights)
    tau_eff = sum(pk * ak for pk, ak in zip(p, normalizers, strict=True))
    for key in param_keys:
        w = global_state[key].to(torch.float64)
        d = torch.zeros_like(w)
        for pk, ak, s in zip(p, normalizers, states, strict=True):
            if ak > 0:
                d.add_((w - s[key].to(torch.float64)) / ak, alpha=pk)
        out[key] = (w - tau_eff * d).to(global_state[key].dtype)
    return out
