"""Aggregation math: pure functions over state dicts and weights (Flower's aggregate.py style).

Sums run in float64 in the order given (the engine passes clients in a fixed order), so the
result does not depend on which worker finished first. States that are rows of one stack
(``fedcore.payload.Row``: a cohort's clients) are reduced straight from the stack, one
weighted reduction per tensor, in row order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from fedcore.payload import Row, StateDict


def normalized_weights(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    return [float(w) / total for w in weights]


def stacked(states: Sequence[StateDict]) -> dict[str, torch.Tensor] | None:
    """(m, ...) per key when every state is a row of one stack (m = len(states), in order),
    else None."""
    if not states or not all(isinstance(s, Row) for s in states):
        return None
    stack = states[0].stack  # type: ignore[attr-defined]
    if any(s.stack is not stack for s in states):  # type: ignore[attr-defined]
        return None
    rows = [s.i for s in states]  # type: ignore[attr-defined]
    n = len(next(iter(stack.values())))
    if rows == list(range(n)):
        return dict(stack)
    some = next(iter(stack.values()))
    sel = torch.as_tensor(rows, dtype=torch.int64).to(some.device, non_blocking=True)
    return {k: v.index_select(0, sel) for k, v in stack.items()}


def _weights_on(w: Sequence[float], stack: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weights as a float64 (m,) tensor on the stack's device (one copy)."""
    device = next(iter(stack.values())).device
    return torch.tensor(w, dtype=torch.float64).to(device, non_blocking=True)


def _along(w: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(m,) weights viewed as (m, 1, ..., 1) to broadcast over stacked ``like``."""
    return w.view(-1, *([1] * (like.dim() - 1)))


def weighted_average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """sum_k w_k * state_k / sum_k w_k per tensor; integer tensors take the maximum.

    Integer tensors are counters such as BatchNorm's ``num_batches_tracked``: an average of
    counters is meaningless, the maximum keeps them monotone.
    """
    if not states:
        raise ValueError("nothing to aggregate")
    w = normalized_weights(weights)
    out: StateDict = {}
    stack = stacked(states)
    if stack is not None:
        wt = _weights_on(w, stack)
        for key, v in stack.items():
            if v.is_floating_point():
                out[key] = (v.to(torch.float64) * _along(wt, v)).sum(0).to(v.dtype)
            else:
                out[key] = v.amax(dim=0)
        return out
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
    stack = stacked(states)
    if stack is not None:  # d = sum_i c_i (w - w_i), c_i = p_i / a_i (0 for a_i = 0)
        c = _weights_on(
            [pk / ak if ak > 0 else 0.0 for pk, ak in zip(p, normalizers, strict=True)], stack
        )
        for key in param_keys:
            w = global_state[key].to(torch.float64)
            rows = stack[key]
            d = ((w - rows.to(torch.float64)) * _along(c, rows)).sum(0)
            out[key] = (w - tau_eff * d).to(global_state[key].dtype)
        return out
    for key in param_keys:
        w = global_state[key].to(torch.float64)
        d = torch.zeros_like(w)
        for pk, ak, s in zip(p, normalizers, states, strict=True):
            if ak > 0:
                d.add_((w - s[key].to(torch.float64)) / ak, alpha=pk)
        out[key] = (w - tau_eff * d).to(global_state[key].dtype)
    return out
