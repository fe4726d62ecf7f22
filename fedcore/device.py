"""The one place that decides where training runs (``--device auto|cpu|cuda``)."""

from __future__ import annotations

import os

import torch

from fedcore.errors import ConfigError


def resolve_device(name: str = "auto") -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                "runtime.device: 'cuda' requested but no CUDA device is available; use auto or cpu"
            )
        return "cuda"
    if name == "cpu":
        return "cpu"
    raise ConfigError(f"runtime.device: {name!r} is not one of auto, cpu, cuda")


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


def deterministic(device: str) -> None:
    """Same configuration, same device, same numbers: on CUDA, cuDNN's deterministic
    algorithms without autotuning and PyTorch's deterministic implementations (a warning,
    not an error, for the few operations that have none). cuBLAS needs its workspace
    setting before its first call to be deterministic; an explicit user value is kept."""
    if not device.startswith("cuda"):
        return  # CPU kernels are deterministic for a fixed thread count
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
