"""``accumulator``: seed 001 §4.2, a one-block transformer over the history of CLS tokens of a
frozen transformer, with an exit after every block. Hand-written: no library ships it.

The history starts at the embedding level: z^0 is the CLS state the first block reads (eq. 4,
recorded by a forward pre-hook on ``blocks[0]``) and z^l (l = 1..L) the CLS state after block
``l`` (exit ``l - 1``, 0-based in the code). With the client token z_client and the layer
embeddings p' = [p'_0, ..., p'_L] (L + 1 rows: one for the embedding level, one per block):

* eq. 7: h^l = Accumulator_phi([z_client, z^0 + p'_0, ..., z^l + p'_l])  # (B, l + 2, H)
  and z^l <- h^l_{l+1}: the next block reads the revised CLS token (token replacement); the
  history keeps the original states;
* eq. 8: y^l = MLP-head_psi(h^l_0 + z^l): the exit reads the client token's output plus the
  *original* CLS state (the "parallel connection" of Table 5, right).

phi is one pre-norm ``nn.TransformerEncoderLayer`` (``heads``, default H / 64; ``mlp_ratio``
default 4; no dropout, as in ``models/minilm.py``), randomly initialised; psi is
Linear(H, H) -> GELU -> Linear(H, classes), shared by every exit (footnote 1: one Accumulator
for all layers). The payload is (phi, psi, z_client, p'); personalization can tune the client
token alone (``accumulator.client_token``, 0.38K parameters at H = 384 in Table 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from annotated_types import Ge, Gt
from torch import nn

from fedcore.errors import ConfigError
from fedcore.options import Float, Int
from fedcore.protocols import cls_blocks, cls_index
from models.adapters.exits import ExitMethod, ExitOptions, active_model


class Accumulator(nn.Module):
    def __init__(
        self, hidden: int, num_classes: int, depth: int, heads: int, mlp_ratio: float
    ) -> None:
        super().__init__()
        self.client_token = nn.Parameter(torch.zeros(hidden))  # z_client
        # p'_0..p'_L: the embedding level plus one per block (eq. 7)
        self.layer_embed = nn.Parameter(torch.randn(depth + 1, hidden) * 0.02)
        self.block = nn.TransformerEncoderLayer(
            hidden,
            heads,
            dim_feedforward=int(hidden * mlp_ratio),
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.head = nn.Sequential(
            nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, history: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(revised CLS (B, H), exit logits (B, classes)) from the CLS states z^0..z^l
        (z^0 the embedding-level state, z^l the last block's output)."""
        z = torch.stack(history, dim=1)  # (B, l + 1, H)
        depth = z.shape[1]
        tokens = torch.cat(
            [self.client_token.expand(z.shape[0], 1, -1), z + self.layer_embed[:depth]], dim=1
        )  # (B, l + 2, H)
        h = self.block(tokens)  # (B, l + 2, H)
        logits = self.head(h[:, 0] + history[-1])  # eq. 8
        return h[:, depth], logits  # eq. 7: h^l_{l+1}


@dataclass(frozen=True)
class AccumulatorOptions(ExitOptions):
    """``grid.adapter_options.accumulator``: the exits' options plus phi's shape (whether
    ``heads`` divides the width is checked at injection, where the width is known)."""

    heads: Annotated[Int, Ge(1)] | None = None  # None: H / 64
    mlp_ratio: Annotated[Float, Gt(0)] = 4.0


class AccumulatorMethod(ExitMethod):
    name = "accumulator"
    summary = "seed 001 Accumulator: one transformer block over the CLS history, exit per block"
    Options: ClassVar[type[Any]] = AccumulatorOptions
    options: AccumulatorOptions

    def build(self, model: nn.Module, hidden: int, num_classes: int, depth: int) -> None:
        heads = self.options.heads or max(1, hidden // 64)
        if heads < 1 or hidden % heads:
            raise ConfigError(
                f"adapter {self.name!r}: heads {heads} must divide the width {hidden}"
            )
        model.accumulator = Accumulator(  # type: ignore[assignment]
            hidden, num_classes, depth, heads, self.options.mlp_ratio
        )

    def trainable_names(self, model: nn.Module) -> set[str]:
        return {n for n, _ in model.named_parameters() if n.startswith("accumulator.")}

    def on_block(
        self, model: nn.Module, index: int, z: torch.Tensor, history: list[torch.Tensor]
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        return model.accumulator(history)  # type: ignore[operator]

    def add_modules(self, model: nn.Module) -> None:
        super().add_modules(model)
        # z^0: the CLS state entering the first block, the head of the history (eq. 7). The
        # model pre-hook (``_begin``) has emptied the history before any block runs.
        blocks = cls_blocks(model)
        assert blocks is not None  # applies_to checked it
        blocks[0].register_forward_pre_hook(_record_embedding_cls, with_kwargs=True)


def _record_embedding_cls(block: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook on ``blocks[0]``: append z^0 (B, H) to the running model's history.
    Module-level (picklable; a deep copy of the model uses its own plan, as in ``exits``)."""
    model = active_model()
    hidden = args[0] if args else kwargs["hidden_states"]  # (B, T, H)
    model.exit_plan._cls.append(hidden[:, cls_index(model)])  # type: ignore[operator, union-attr]
