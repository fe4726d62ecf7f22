"""``lw_mlp``: a two-layer MLP head after every transformer block, the base frozen (seed 001
§5 baseline "Layer-wise MLP"). Hand-written: no library ships it. Exit ``l`` reads the CLS
state after block ``l``; the payload is the heads.

The head is Linear(H, r·H) -> GELU -> Linear(r·H, classes) with ``mlp_ratio`` r = 4 by
default: the seed does not give the width, but its Table 5 count, 8.95M on DeiT-S with 100
classes, is 12 x (384 x 1536 + 1536 + 1536 x 100 + 100) = 8.94M, a width of 4H (r = 1 would be
2.24M). The seed adds dropout; fedapt leaves it out because the engine gives a client no
random stream for the model (global-RNG dropout would make metrics depend on the worker
layout; ``models/minilm.py`` does the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Gt
from torch import nn

from fedcore.options import Float
from models.adapters.exits import ExitOptions
from models.adapters.lw_linear import LayerwiseLinear


@dataclass(frozen=True)
class LayerwiseMLPOptions(ExitOptions):
    """``grid.adapter_options.lw_mlp``: the exits' options plus the heads' hidden width as a
    multiple of the model's (``mlp_ratio``)."""

    mlp_ratio: Annotated[Float, Gt(0)] = 4.0


class LayerwiseMLP(LayerwiseLinear):
    name = "lw_mlp"
    summary = "a two-layer MLP head on the CLS state after every block (early exits); base frozen"
    Options: ClassVar[type[Any]] = LayerwiseMLPOptions
    options: LayerwiseMLPOptions

    def make_head(self, hidden: int, num_classes: int) -> nn.Module:
        width = max(1, round(hidden * self.options.mlp_ratio))
        return nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, num_classes))
