"""What crosses the simulated network, and how many bytes it takes.

Every download (server -> client) and upload (client -> server) in fedapt is a real
serialization of the tensors that travel: ``encode`` turns a state dict into the bytes a
transport would carry (``torch.save``'s zip container, the format ``torch.load`` and most
FL frameworks exchange) and ``decode`` is what the receiver runs. The engine counts
``len(encode(...))``, never an estimate from shapes, so container overhead is included. The
overhead over the raw tensor bytes (``tensor_nbytes``) is measured in
``tests/test_payload.py`` and reported in the README.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import torch

StateDict = dict[str, torch.Tensor]

MIB = 2**20


def encode(state: Mapping[str, torch.Tensor]) -> bytes:
    """Serialize tensors for the wire (contiguous CPU copies, keys in the given order)."""
    buf = io.BytesIO()
    torch.save({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, buf)
    return buf.getvalue()


def decode(data: bytes) -> StateDict:
    """Inverse of :func:`encode`; ``weights_only`` so a payload can never run code."""
    out = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(out, dict):
        raise ValueError("payload is not a state dict")
    return out


def tensor_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    """Raw bytes of the tensors alone (numel * element size), without any container."""
    return sum(t.numel() * t.element_size() for t in state.values())


def is_finite(state: Mapping[str, torch.Tensor]) -> bool:
    """True when every floating-point tensor is free of NaN and Inf."""
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


def mib(nbytes: int | float) -> float:
    """Bytes to MiB (2**20 bytes); fedapt always labels these figures MiB."""
    return nbytes / MIB
