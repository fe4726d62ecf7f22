"""ViT / DeiT image encoders from timm, with ImageNet weights for users with internet.

``vit_small`` (ViT-S/16), ``deit_small`` (DeiT-S/16) and ``vit_base`` (ViT-B/16, the shape of
seed 003's payload table) are timm's ``VisionTransformer`` with fedapt's model interface.
``pretrained: true`` (``model.base: imagenet``) downloads timm's default weights from the
Hugging Face hub once (``vit_*``: augreg in21k -> in1k, ``deit_small``: fb in1k; cached in
``$HF_HOME``); without internet and without the cache the build stops with one line
(``ConfigError``), as ``tv_resnet*`` do. ``pretrained`` defaults to false, so listing,
counting and testing these models never touches the network.

One change to timm's layout: each block's fused ``attn.qkv`` Linear (D -> 3D) is split into
``attn.qkv.query`` / ``key`` / ``value`` (D -> D each, :class:`SplitQKV`), concatenated in
timm's [q, k, v] order, so the block computes exactly what timm's does and LoRA can target the
query and value projections alone, as on BERT (seed 003; ``models/adapters/lora.py``).

CLS plumbing (``models/text.py``): ``blocks`` is timm's ``nn.Sequential`` of blocks,
``hidden_size`` = ``embed_dim``, ``cls_index`` = 0 (the class token), the head ``head`` reads
the final (normed) class token.

Input (``input_spec``): 224x224 by default (``model.input_size`` overrides it: any multiple of
the patch, 16 pixels, or ``model.options.patch_size`` for a ViT trained from scratch on small
images; the position embeddings are built, or resampled from the weights, for the size;
``model.options.depth`` builds fewer blocks and ``model.options.embed_dim`` a narrower one,
a multiple of 64 with one head per 64 channels (192: ViT-Ti's width), at random init: the
tests' small configs and the cpu stand-ins for the seeds' DeiT-S);
with the weights, three channels and the weights' own normalisation (0.5 / 0.5 for ViT's augreg,
ImageNet mean/std for DeiT; read from timm's config, no download).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from annotated_types import Ge
from pydantic import Strict
from torch import nn

from fedcore.errors import ConfigError
from fedcore.inputs import InputSpec
from fedcore.options import Int
from models.registry import Builder, backbone
from models.vit_arch import ViTConfig

HEAD_DIM = 64  # channels per attention head in every ViT here (ViT-Ti/S/B: 192/3, 384/6, 768/12)
ARCHS = {
    "vit_small": ViTConfig("vit_small_patch16_224", 384, 12, 6),
    "deit_small": ViTConfig("deit_small_patch16_224", 384, 12, 6),
    "vit_base": ViTConfig("vit_base_patch16_224", 768, 12, 12),
}


def _spec_for(name: str) -> Any:
    def spec(pretrained: bool = False, **_: object) -> InputSpec:
        if not pretrained:
            return InputSpec(size=224)
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(ARCHS[name].timm_name or "")
        mean = tuple(cfg.mean) if cfg else None
        std = tuple(cfg.std) if cfg else None
        return InputSpec(size=224, channels=3, mean=mean, std=std, note=f"timm {name}")

    return spec


def _builder(name: str) -> Builder:
    config = ARCHS[name]

    def build(
        *,
        num_classes: int,
        in_channels: int = 3,
        input_size: int = 224,
        pretrained: Annotated[bool, Strict()] = False,
        patch_size: Annotated[Int, Ge(1)] = 16,
        depth: Annotated[Int, Ge(1)] | None = None,
        embed_dim: Annotated[Int, Ge(HEAD_DIM)] | None = None,
    ) -> nn.Module:
        # The options' own values are checked against the annotations (models.registry);
        # what they say about each other and the input size, here.
        if pretrained and depth not in (None, config.depth):
            raise ConfigError(f"model {name!r}: the ImageNet weights have {config.depth} blocks")
        if pretrained and embed_dim not in (None, config.embed_dim):
            raise ConfigError(
                f"model {name!r}: the ImageNet weights are {config.embed_dim} wide "
                f"(got embed_dim {embed_dim})"
            )
        if embed_dim is not None and embed_dim % HEAD_DIM:
            raise ConfigError(
                f"model {name!r}: embed_dim must be a multiple of {HEAD_DIM} (one attention "
                f"head per {HEAD_DIM} channels, as in ViT-Ti/S/B; got {embed_dim})"
            )
        if pretrained and patch_size != config.patch_size:
            raise ConfigError(
                f"model {name!r}: the ImageNet weights have {config.patch_size}-pixel patches "
                f"(got patch_size {patch_size})"
            )
        if input_size < patch_size:
            raise ConfigError(f"model {name!r} needs input_size >= {patch_size} (got {input_size})")
        if input_size % patch_size:
            raise ConfigError(
                f"model {name!r} needs an input_size that is a multiple of its {patch_size}-pixel "
                f"patch (got {input_size}; e.g. model.input_size: "
                f"{round(input_size / patch_size) * patch_size})"
            )
        from models.timm_vit import ViTClassifier  # timm imports torchvision: 3.5 s, lazily

        return ViTClassifier(
            replace(
                config,
                patch_size=patch_size,
                depth=depth or config.depth,
                embed_dim=embed_dim or config.embed_dim,
                num_heads=(embed_dim or config.embed_dim) // HEAD_DIM,
            ),
            num_classes=num_classes,
            in_channels=in_channels,
            input_size=input_size,
            pretrained=pretrained,
        )

    build.__name__ = build.__qualname__ = name  # the module-level name below (pickle)
    build.__doc__ = f"timm {config.timm_name} (ImageNet weights with pretrained: true)."
    return backbone(input_spec=_spec_for(name))(build)


# Module-level names, where pickle finds their options (``vit_small.Options``).
vit_small = _builder("vit_small")
deit_small = _builder("deit_small")
vit_base = _builder("vit_base")
