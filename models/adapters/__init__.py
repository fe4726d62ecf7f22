"""Adaptation methods: which parameters train and travel (registry shared by all backbones).

This foundation ships ``full`` (fine-tune everything; the payload is the whole state dict).
Parameter-efficient methods (residual, Houlsby, Pfeiffer, LoRA, ...) register here too.
"""

from __future__ import annotations

from fedcore.errors import UnknownNameError

ADAPTER_METHODS: dict[str, str] = {
    "full": "fine-tune every parameter; the payload is the whole state dict",
}


def list_adapters() -> list[str]:
    return sorted(ADAPTER_METHODS)


def check_adapter(name: str) -> str:
    if name not in ADAPTER_METHODS:
        raise UnknownNameError("adapter method", name, ADAPTER_METHODS)
    return name
