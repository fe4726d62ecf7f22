"""Small helpers of the cohort engine: memory, state-dict views, the trained part's module."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedcore.client import split_state
from fedcore.payload import StateDict


def available_memory(device: str) -> int:
    """Bytes free for a cohort on ``device`` (CUDA: free device memory; CPU: MemAvailable)."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a dependency of the pinned set
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def activation_bytes(model: nn.Module, state: StateDict, x: torch.Tensor) -> int:
    """Bytes of every module output of one forward pass on ``x`` (what backward keeps)."""
    total = 0

    def hook(_m: nn.Module, _a: Any, out: Any) -> None:
        nonlocal total
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            params, buffers = split_state(model, state)
            functional_call(model, (params, {k: v.clone() for k, v in buffers.items()}), (x,))
    finally:
        for h in handles:
            h.remove()
    return total


def under(d: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``d`` under module ``prefix`` ("fc3."), named relative to it."""
    if not prefix:
        return dict(d)
    n = len(prefix)
    return {k[n:]: v for k, v in d.items() if k.startswith(prefix)}


def unchanged(frozen: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor]) -> bool:
    """The frozen tensors still hold the values a cache was computed from."""
    return all(
        frozen[k] is ref
        or (frozen[k].data_ptr() == ref.data_ptr() and frozen[k]._version == ref._version)
        or torch.equal(frozen[k], ref)
        for k, ref in refs.items()
    )


def picked(work: StateDict, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """The entries of ``work`` at ``keys``, in that order."""
    return {k: work[k] for k in keys}


def common_module(keys: Sequence[str]) -> str:
    """The deepest module holding every key ("" when it is the model itself)."""
    parts = [k.split(".")[:-1] for k in keys]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)
