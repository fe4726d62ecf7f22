"""``bn_head``: train every BatchNorm layer (affine parameters and running statistics) and
the classifier; the convolutions and other layers are the frozen base. Seed 000's adapters
without the adapters: its domain-specific BatchNorm + head (§III)."""

from __future__ import annotations

from torch import nn

from models.adapters.base import AdapterMethod, adapter_head, batchnorm_names, head_name


def bn_and_head(model: nn.Module) -> set[str]:
    prefixes = [*batchnorm_names(model), adapter_head(model)]
    return {
        n
        for n, _ in model.named_parameters()
        if any(p is not None and n.startswith(f"{p}.") for p in prefixes)
    }


class BNHead(AdapterMethod):
    name = "bn_head"
    summary = "train BatchNorm (parameters and statistics) and the classifier"

    def applies_to(self, model: nn.Module) -> str | None:
        if head_name(model) is None:
            return "it has no nn.Linear classifier"
        if not batchnorm_names(model):
            return "it has no BatchNorm layer with affine parameters"
        return None

    def trainable_names(self, model: nn.Module) -> set[str]:
        return bn_and_head(model)
