"""The base of every update codec (kind ``none``: tensors as the model holds them): its name,
the directions it serves, and one tensor's ``encode`` / ``decode``. A codec kind subclasses
it (``fedcore.codecs.kinds``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import torch
from annotated_types import MinLen

from fedcore.options import FORBID_EXTRA

StateDict = dict[str, torch.Tensor]
Direction = Literal["upload", "download"]
DIRECTIONS: tuple[Direction, ...] = ("upload", "download")
SEP = "#"  # wire key = model key + SEP + part


@dataclass(frozen=True)
class Codec:
    """Kind ``none``: every tensor as the model holds it. The base of every kind: its name,
    the directions it serves, and ``encode`` / ``decode`` of one tensor."""

    __pydantic_config__: ClassVar = FORBID_EXTRA
    kind: ClassVar[str] = "none"
    name: str = "none"
    directions: Annotated[tuple[Direction, ...], MinLen(1)] = DIRECTIONS

    @property
    def stochastic(self) -> bool:
        """It rounds uploads at random (a generator per client job)."""
        return False

    @property
    def uses_memory(self) -> bool:
        """It keeps each client's error-feedback memory."""
        return False

    def encode(
        self, x: torch.Tensor, *, upload: bool = True, gen: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Wire parts of floating tensor ``x`` (part name -> tensor, on ``x``'s device)."""
        return {"": x}

    def decode(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The tensor ``encode`` sent, as ``dtype``."""
        return parts[""].to(dtype)
