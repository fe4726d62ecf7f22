"""The optimisers' arithmetic on stacked clients: ``torch.optim.sgd`` and ``torch.optim.adam``
(single-tensor path), element by element, each client with its own state and step count."""

from __future__ import annotations

import numpy as np
import torch


def sgd_step(k, p, g, sel, host_sel, n, lr, cfg, mom, started) -> None:
    """torch.optim.sgd's single-tensor update on stacked clients (p updated in place).
    ``sel``: the clients' rows on the device (None: all), ``host_sel`` the same on the host,
    where which clients have optimiser state is kept (bookkeeping read without a wait)."""
    d_p = g if cfg.weight_decay == 0 else g.add(p, alpha=cfg.weight_decay)
    if cfg.momentum != 0:
        if k not in mom:
            mom[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
            started[k] = np.zeros(n, dtype=bool)
        buf = mom[k] if sel is None else mom[k].index_select(0, sel)
        was = started[k] if host_sel is None else started[k][host_sel]
        if not was.any():  # every client's first step: buf = d_p
            new = d_p.clone()
        else:
            new = buf.mul(cfg.momentum).add_(d_p)  # buf * momentum + (1 - dampening) * d_p
            if not was.all():  # some clients' first step: buf = d_p
                shape = (-1,) + (1,) * (p.dim() - 1)
                new = torch.where(torch.from_numpy(was).view(shape).to(p.device), new, d_p)
        if sel is None:
            mom[k] = new
            started[k][:] = True
        else:
            mom[k].index_copy_(0, sel, new)
            started[k][host_sel] = True
        d_p = new
    p.add_(d_p, alpha=-lr)


def adam_step(k, p, g, sel, host_sel, n, lr, cfg, started, exp_avg, exp_avg_sq, adam_steps) -> None:
    """torch.optim.adam's single-tensor update (decoupled weight decay, betas 0.9/0.999,
    eps 1e-8) on stacked clients; each client's step count is its own."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    if k not in exp_avg:
        exp_avg[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
        exp_avg_sq[k] = torch.zeros_like(exp_avg[k])
        adam_steps[k] = np.zeros(n, dtype=np.float32)
    m = exp_avg[k] if sel is None else exp_avg[k].index_select(0, sel)
    v = exp_avg_sq[k] if sel is None else exp_avg_sq[k].index_select(0, sel)
    st = adam_steps[k] if host_sel is None else adam_steps[k][host_sel]
    if cfg.weight_decay != 0:
        p.mul_(1 - lr * cfg.weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    st = st + 1
    shape = (-1,) + (1,) * (p.dim() - 1)
    # Per client: bias corrections of its own step (Python floats in torch.optim.adam).
    steps_list = [float(t) for t in st.tolist()]
    if len(set(steps_list)) == 1:
        step = steps_list[0]
        step_size = lr / (1 - beta1**step)
        bc2_sqrt = (1 - beta2**step) ** 0.5
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
    else:
        step_size = torch.tensor(
            [lr / (1 - beta1**t) for t in steps_list], dtype=p.dtype, device=p.device
        ).view(shape)
        bc2_sqrt = torch.tensor(
            [(1 - beta2**t) ** 0.5 for t in steps_list], dtype=p.dtype, device=p.device
        ).view(shape)
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.sub_(step_size * m / denom)
    if sel is None:
        exp_avg[k], exp_avg_sq[k], adam_steps[k] = m, v, st
    else:
        exp_avg[k].index_copy_(0, sel, m)
        exp_avg_sq[k].index_copy_(0, sel, v)
        adam_steps[k][host_sel] = st
