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


# len(encode(state)) depends on the keys, dtypes, shapes and storage sharing of the tensors,
# never on their values: torch.save's zip stores each storage uncompressed at an aligned offset
# and the pickle holds names, dtypes and shapes only. One real encoding per structure is
# enough to know every later size (tests/test_payload.py checks it against real encodings).
_SIZES: dict[tuple, int] = {}


def _structure(state: Mapping[str, torch.Tensor], fresh: bool = False) -> tuple:
    """What ``encode`` writes, less the values: per key the dtype and shape, and the storage
    the tensor is saved from (its size, the tensor's offset in it, which earlier key shares
    it). A CPU view is saved with its whole storage; a tensor on another device is copied
    to a storage of its own first, exactly as ``encode`` does. ``fresh``: as if every tensor
    were a copy of its own (what a client that owns its tensors sends)."""
    owners: dict[int, int] = {}
    out: list[tuple] = []
    for k, v in state.items():
        t = v.detach()
        if fresh or t.device.type != "cpu" or not t.is_contiguous():
            where: tuple = (t.numel() * t.element_size(), 0, -1)  # a fresh contiguous copy
        else:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            shared = owners.setdefault(ptr, len(owners)) if storage.nbytes() else -1
            where = (storage.nbytes(), t.storage_offset(), shared)
        out.append((k, t.dtype, tuple(t.shape), where))
    return tuple(out)


def encoded_size(state: Mapping[str, torch.Tensor], *, fresh: bool = False) -> int:
    """``len(encode(state))`` without serializing the values (the tensors may stay on their
    device): the size is a function of the structure alone, encoded for real once per
    structure and remembered. ``fresh``: the size of ``encode`` of own copies of the tensors
    (a row of a cohort's stacked states is a view of the whole stack)."""
    key = _structure(state, fresh)
    size = _SIZES.get(key)
    if size is None:
        sent = {k: v.detach().clone() for k, v in state.items()} if fresh else state
        size = _SIZES[key] = len(encode(sent))
    return size


class Row(Mapping[str, torch.Tensor]):
    """Row ``i`` of stacked states (``stack[key]``: (n, ...), one row per client), read as
    one client's state dict; ``fedcore.aggregate`` reduces rows of one stack in one call per
    tensor instead of one per client."""

    def __init__(self, stack: Mapping[str, torch.Tensor], i: int) -> None:
        self.stack, self.i = stack, i

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.stack[key][self.i]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.stack)

    def __len__(self) -> int:
        return len(self.stack)


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
    """True when every floating-point tensor is free of NaN and Inf, read back once.

    A float64 sum is finite exactly when every summed element is (float32 and float64 model
    values stay far below float64's range; NaN and Inf propagate, +Inf and -Inf give NaN)."""
    sums = [t.sum(dtype=torch.float64) for t in state.values() if t.is_floating_point()]
    return not sums or bool(torch.isfinite(torch.stack(sums).sum()))


def mib(nbytes: int | float) -> float:
    """Bytes to MiB (2**20 bytes); fedapt always labels these figures MiB."""
    return nbytes / MIB
