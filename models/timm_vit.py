"""The timm side of ``models/vit.py`` (imported only when a ViT is built: timm imports
torchvision and torch._dynamo, about 3.5 s here)."""

from __future__ import annotations

import socket
from typing import cast
from urllib.parse import urlparse

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from fedcore.errors import ConfigError
from models.vit_arch import ViTConfig

DOWNLOAD_TIMEOUT_S = 30.0  # per socket operation: an unreachable hub must not hang a run


class SplitQKV(nn.Module):
    """timm's fused qkv projection as three Linears; output [q | k | v], (B, T, 3D)."""

    def __init__(self, fused: nn.Linear) -> None:
        super().__init__()
        d, bias = fused.out_features // 3, fused.bias is not None
        self.query = nn.Linear(fused.in_features, d, bias=bias)
        self.key = nn.Linear(fused.in_features, d, bias=bias)
        self.value = nn.Linear(fused.in_features, d, bias=bias)
        with torch.no_grad():
            for i, part in enumerate((self.query, self.key, self.value)):
                part.weight.copy_(fused.weight[i * d : (i + 1) * d])
                if bias:
                    part.bias.copy_(fused.bias[i * d : (i + 1) * d])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)  # (B, T, 3D)


def _download_state(
    timm_name: str, *, num_classes: int, in_channels: int, input_size: int
) -> dict[str, torch.Tensor]:
    """timm's default ImageNet weights for ``timm_name`` at this input (head re-initialised)."""
    import huggingface_hub.constants as hub
    import timm

    # An unreachable hub: read the cache only (the hub client would retry for a minute).
    was_offline = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = was_offline or not _reachable(hub.ENDPOINT)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        net = timm.create_model(
            timm_name,
            pretrained=True,
            num_classes=num_classes,
            in_chans=in_channels,
            img_size=input_size,
        )
    except Exception as exc:  # hub unreachable, HF_HUB_OFFLINE without a cache, bad file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise ConfigError(
            f"timm's ImageNet weights {timm_name!r} could not be downloaded ({reason}); they "
            f"need internet once (then cached under $HF_HOME); offline use efficientnet_lite0 "
            f"or minilm, or set model.base: none"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)
        hub.HF_HUB_OFFLINE = was_offline
    return net.state_dict()


def _reachable(endpoint: str) -> bool:
    """Whether the hub's host accepts a TCP connection (DNS included) within the timeout."""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=DOWNLOAD_TIMEOUT_S).close()
    except OSError:
        return False
    return True


class ViTClassifier(VisionTransformer):
    """timm's VisionTransformer (class-token pooling) with fedapt's model interface."""

    classifier_name = "head"
    cls_index = 0

    def __init__(
        self,
        config: ViTConfig,
        *,
        num_classes: int,
        in_channels: int = 3,
        input_size: int = 224,
        pretrained: bool = False,
    ) -> None:
        super().__init__(
            img_size=input_size,
            patch_size=config.patch_size,
            in_chans=in_channels,
            num_classes=num_classes,
            global_pool="token",
            embed_dim=config.embed_dim,
            depth=config.depth,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
        )
        if pretrained:
            if config.timm_name is None:
                raise ConfigError("this ViT configuration has no ImageNet weights")
            self.load_state_dict(
                _download_state(
                    config.timm_name,
                    num_classes=num_classes,
                    in_channels=in_channels,
                    input_size=input_size,
                )
            )
        for block in self.blocks:
            attn = cast(nn.Module, block.attn)
            attn.qkv = SplitQKV(cast(nn.Linear, attn.qkv))

    @property
    def hidden_size(self) -> int:
        return int(self.embed_dim)

    def block_names(self) -> list[str]:
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def layer_groups(self) -> list[list[str]]:
        """Embeddings, each block, final norm + head (FedNILO freezes them in this order)."""
        embed = ["cls_token", "pos_embed", "patch_embed"]
        return [embed, *[[n] for n in self.block_names()], ["norm", "head"]]
