"""The one place that decides where training runs (``--device auto|cpu|cuda``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from fedcore.errors import ConfigError


def resolve_device(name: str = "auto") -> str:
    """``runtime.device`` -> the device training runs on; a CUDA device that is not there is
    the one-line ConfigError, never a silent CPU run."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    index = name.partition(":")[2]
    if name == "cuda" or (name.startswith("cuda:") and index.isdigit()):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"runtime.device: {name!r} requested but no CUDA device is available; "
                "use auto or cpu"
            )
        if index and int(index) >= count:
            raise ConfigError(
                f"runtime.device: {name!r} requested but this machine has {count} CUDA "
                f"device(s) (cuda:0 to cuda:{count - 1})"
            )
        return name
    raise ConfigError(f"runtime.device: {name!r} is not one of auto, cpu, cuda, cuda:N")


def resolve_workers(workers: int | str, device: str, clients_per_round: int) -> int:
    """CPU worker processes: one single-thread client per core (0 = in this process)."""
    if device != "cpu":
        return 0
    if workers == "auto":
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        n = min(cores, clients_per_round)
        return n if n > 1 else 0
    return int(workers)


CUBLAS_WORKSPACE = ":4096:8"


def prepare_cuda() -> None:
    """What CUDA libraries read once, at their first call, set before it: cuBLAS's workspace
    size, which its deterministic mode needs (an explicit user value is kept). Called at the
    CLI's entry and by :func:`deterministic`; setting it after cuBLAS ran has no effect."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


@contextlib.contextmanager
def deterministic(device: str) -> Iterator[None]:
    """Same configuration, same device, same numbers, for the duration of a run on CUDA:
    cuDNN's deterministic algorithms without autotuning, PyTorch's deterministic
    implementations (a warning, not an error, for the few operations that have none), no
    NaN-fill of new tensors (a kernel per allocation; every kernel writes what it allocates),
    and TF32 off for matrix products and convolutions (CUDA then computes in float32, as the
    CPU does). The previous settings come back on exit, so other work in the process (a CPU
    run, the caller's own CUDA code) is unaffected. On the CPU nothing changes: its kernels
    are deterministic for a fixed thread count."""
    if not device.startswith("cuda"):
        yield
        return
    prepare_cuda()
    det: Any = torch.utils.deterministic
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (
        cudnn.deterministic,
        cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        det.fill_uninitialized_memory,
        cuda.allow_tf32,
        cudnn.allow_tf32,
    )
    cudnn.deterministic, cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = False
    cuda.allow_tf32 = cudnn.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        det.fill_uninitialized_memory = saved[4]
        cuda.allow_tf32, cudnn.allow_tf32 = saved[5], saved[6]
