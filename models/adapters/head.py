"""``head``: train the classifier only (linear probing); the rest, BatchNorm statistics
included, is the frozen base (seed 001's layer-wise linear heads, at the last layer).

On a decoder whose LM head is tied to its input embedding (``models/decoder.py``) the
classifier *is* that embedding (vocab x hidden): ``head`` trains and sends it, so the input
side moves with the output side; on gpt2 that is 38.6M of 124M parameters."""

from __future__ import annotations

from torch import nn

from models.adapters.base import AdapterMethod, head_name


class Head(AdapterMethod):
    name = "head"
    summary = "train the classifier only; the base, BatchNorm statistics included, is frozen"

    def applies_to(self, model: nn.Module) -> str | None:
        if head_name(model) is None:
            return "it has no nn.Linear classifier"
        return None

    def trainable_names(self, model: nn.Module) -> set[str]:
        head = head_name(model)
        return {n for n, _ in model.named_parameters() if n.startswith(f"{head}.")}
