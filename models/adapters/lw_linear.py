"""``lw_linear``: a linear classification head after every transformer block, the base
frozen (seed 001 §5 baseline "Layer-wise Linear"). Hand-written: no
library ships it. Exit ``l`` reads the CLS state after block ``l``; the payload is the heads.
"""

from __future__ import annotations

import torch
from torch import nn

from models.adapters.exits import ExitMethod


class LayerwiseLinear(ExitMethod):
    name = "lw_linear"
    summary = "a linear head on the CLS state after every block (early exits); base frozen"

    def make_head(self, hidden: int, num_classes: int) -> nn.Module:
        return nn.Linear(hidden, num_classes)

    def build(self, model: nn.Module, hidden: int, num_classes: int, depth: int) -> None:
        model.exit_heads = nn.ModuleList(  # type: ignore[assignment]
            [self.make_head(hidden, num_classes) for _ in range(depth)]
        )

    def trainable_names(self, model: nn.Module) -> set[str]:
        return {n for n, _ in model.named_parameters() if n.startswith("exit_heads.")}

    def exit_head_path(self, index: int) -> str:
        """The module of exit ``index``: it reads only the CLS state after block ``index``,
        which the frozen encoder computes whatever the heads are (the cohort engine caches
        it: ``fedcore.cohort``)."""
        return f"exit_heads.{index}"

    def on_block(
        self, model: nn.Module, index: int, z: torch.Tensor, history: list[torch.Tensor]
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        return None, model.exit_heads[index](z)  # type: ignore[index,operator]
