"""``full``: fine-tune every parameter; the whole state dict trains and travels (FedAvg's
payload, seed 000's "22.2 MB" for ResNet26)."""

from __future__ import annotations

from torch import nn

from models.adapters.base import AdapterMethod


class Full(AdapterMethod):
    name = "full"
    summary = "fine-tune every parameter; the payload is the whole state dict"

    def trainable_names(self, model: nn.Module) -> set[str]:
        return {n for n, _ in model.named_parameters()}

    def payload_keys(self, model: nn.Module) -> tuple[str, ...]:
        return tuple(model.state_dict())  # buffers of every layer included
