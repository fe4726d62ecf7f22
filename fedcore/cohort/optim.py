"""The optimisers' arithmetic on stacked clients: ``torch.optim.sgd`` and ``torch.optim.adam``
(single-tensor path), element by element, each client with its own state and step count."""

from __future__ import annotations

import torch


def sgd_step(k, p, g, sel, n, lr, cfg, mom, started) -> None:
    """torch.optim.sgd's single-tensor update on stacked clients (p updated in place)."""
    d_p = g if cfg.weight_decay == 0 else g.add(p, alpha=cfg.weight_decay)
    if cfg.momentum != 0:
        if k not in mom:
            mom[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
            # On the host: which clients have a momentum buffer is bookkeeping, and a
            # device tensor here would make every step wait for the device.
            started[k] = torch.zeros(n, dtype=torch.bool)
        buf = mom[k] if sel is None else mom[k].index_select(0, sel)
        was = started[k] if sel is None else started[k].index_select(0, sel.cpu())
        new = buf.mul(cfg.momentum).add_(d_p)  # buf * momentum + (1 - dampening) * d_p
        if not bool(was.all()):  # first step of a client: buf = d_p
            shape = (-1,) + (1,) * (p.dim() - 1)
            new = torch.where(was.view(shape).to(p.device), new, d_p)
        if sel is None:
            mom[k] = new
            started[k].fill_(True)
        else:
            mom[k].index_copy_(0, sel, new)
            started[k].index_fill_(0, sel.cpu(), True)
        d_p = new
    p.add_(d_p, alpha=-lr)


def adam_step(k, p, g, sel, n, lr, cfg, started, exp_avg, exp_avg_sq, adam_steps) -> None:
    """torch.optim.adam's single-tensor update (decoupled weight decay, betas 0.9/0.999,
    eps 1e-8) on stacked clients; each client's step count is its own."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    if k not in exp_avg:
        exp_avg[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
        exp_avg_sq[k] = torch.zeros_like(exp_avg[k])
        adam_steps[k] = torch.zeros(n, dtype=torch.float32)
    m = exp_avg[k] if sel is None else exp_avg[k].index_select(0, sel)
    v = exp_avg_sq[k] if sel is None else exp_avg_sq[k].index_select(0, sel)
    st = adam_steps[k] if sel is None else adam_steps[k].index_select(0, sel.cpu())
    if cfg.weight_decay != 0:
        p.mul_(1 - lr * cfg.weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    st = st + 1
    shape = (-1,) + (1,) * (p.dim() - 1)
    # Per client: bias corrections of its own step (Python floats in torch.optim.adam).
    steps_list = [float(t) for t in st]
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
        adam_steps[k].index_copy_(0, sel.cpu(), st)
