"""The cohort steps benchmarks/gpu_kernels.py times: the engine's vmap step, and the same
step written out for stacked clients without vmap (grouped convolutions, channels-last, or
im2col matmuls)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

LR = 0.1

Params = dict[str, torch.Tensor]


def vmap_step(
    model: torch.nn.Module,
) -> Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss_of(p: Params, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    fn = vmap(grad_and_value(loss_of), randomness="error")

    def step(P: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = fn(P, x, y)
        with torch.no_grad():
            for k, p in P.items():
                p.add_(grads[k], alpha=-LR)
        return loss

    return step


def _conv_grouped(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, cl: bool) -> torch.Tensor:
    """x (B, n*cin, H, W), w (n, cout, cin, k, k) -> (B, n*cout, H', W')."""
    n, cout = w.shape[:2]
    weight = w.reshape(n * cout, *w.shape[2:])
    if cl:
        weight = weight.contiguous(memory_format=torch.channels_last)
    return F.conv2d(x, weight, b.reshape(-1), groups=n)


def _conv_im2col(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x (n, B, cin, H, W), w (n, cout, cin, k, k) -> (n, B, cout, H', W')."""
    n, bsz, cin, h, wd = x.shape
    cout, k = w.shape[1], w.shape[-1]
    ho, wo = h - k + 1, wd - k + 1
    cols = F.unfold(x.reshape(n * bsz, cin, h, wd), k)  # (n*B, cin*k*k, ho*wo)
    cols = cols.view(n, bsz, cin * k * k, ho * wo).permute(0, 2, 1, 3).reshape(n, cin * k * k, -1)
    out = torch.baddbmm(b.unsqueeze(-1), w.reshape(n, cout, -1), cols)  # (n, cout, B*ho*wo)
    return out.view(n, cout, bsz, ho, wo).permute(0, 2, 1, 3, 4)


def manual_step(kind: str) -> Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The cohort step written out for stacked clients, without vmap; autograd of the sum of
    the clients' mean losses gives each client its own gradient."""

    def forward(P: Params, x: torch.Tensor) -> torch.Tensor:
        n, bsz = x.shape[:2]
        if kind == "im2col":
            h = torch.relu(_conv_im2col(x, P["conv1.weight"], P["conv1.bias"]))
            h = torch.relu(_conv_im2col(h, P["conv2.weight"], P["conv2.bias"]))
            h = F.max_pool2d(h.reshape(n * bsz, *h.shape[2:]), 2).reshape(n, bsz, -1)
        else:
            cl = kind == "grouped_cl"
            h = x.transpose(0, 1).reshape(bsz, n * x.shape[2], *x.shape[3:])
            if cl:
                h = h.contiguous(memory_format=torch.channels_last)
            h = torch.relu(_conv_grouped(h, P["conv1.weight"], P["conv1.bias"], cl))
            h = torch.relu(_conv_grouped(h, P["conv2.weight"], P["conv2.bias"], cl))
            h = F.max_pool2d(h, 2)  # (B, n*64, 14, 14)
            h = h.reshape(bsz, n, -1).transpose(0, 1)  # (n, B, 64*14*14), torch's flatten order
        h = torch.relu(
            torch.baddbmm(P["fc1.bias"].unsqueeze(1), h, P["fc1.weight"].transpose(1, 2))
        )
        return torch.baddbmm(P["fc2.bias"].unsqueeze(1), h, P["fc2.weight"].transpose(1, 2))

    def step(P: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        leaves = {k: v.detach().requires_grad_(True) for k, v in P.items()}
        logits = forward(leaves, x)
        n, bsz = y.shape
        loss = F.cross_entropy(logits.reshape(n * bsz, -1), y.reshape(-1), reduction="none")
        loss = loss.view(n, bsz).mean(1)
        grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
        with torch.no_grad():
            for p, g in zip(P.values(), grads, strict=True):
                p.add_(g, alpha=-LR)
        return loss.detach()

    return step
