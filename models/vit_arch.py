"""A ViT architecture's numbers, apart from the timm-backed module (``models.timm_vit``) so
that the registry (``models.vit``) lists and checks ViTs without importing timm."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViTConfig:
    timm_name: str | None  # timm architecture whose ImageNet weights load (None: none)
    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 16
    mlp_ratio: float = 4.0
