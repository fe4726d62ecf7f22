"""``lw_mlp``: a two-layer MLP head after every transformer block, the base frozen (seed 001
§5 baseline "Layer-wise MLP"). Hand-written: no library ships it. Exit ``l`` reads the CLS
state after block ``l``; the payload is the heads.

The head is Linear(H, H) -> GELU -> Linear(H, classes). The seed adds dropout; fedapt leaves it
out because the engine gives a client no random stream for the model (global-RNG dropout would
make metrics depend on the worker layout; ``models/minilm.py`` does the same).
"""

from __future__ import annotations

from torch import nn

from models.adapters.lw_linear import LayerwiseLinear


class LayerwiseMLP(LayerwiseLinear):
    name = "lw_mlp"
    summary = "a two-layer MLP head on the CLS state after every block (early exits); base frozen"

    def make_head(self, hidden: int, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, num_classes))
