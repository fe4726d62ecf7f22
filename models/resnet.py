"""ResNet26 of Rebuffi et al. (residual adapters, Visual Decathlon), the base of seed 000.

Follows Rebuffi's ``res_adapt`` code (srebuffi/residual_adapters, ``models.py``): a 3x3 stem
conv to 32*w channels with BatchNorm and no ReLU (``pre_layers_conv`` is a bare ``conv_task``),
three stages of four BasicBlocks with 64*w, 128*w, 256*w channels, each stage -- the first one
included -- starting with a stride-2 block whose shortcut is parameter-free (2x2 average
pooling, then zero channels concatenated), BatchNorm + ReLU, global average pooling and a
linear head; conv weights ~ N(0, 2/(k*k*out)) and BatchNorm at (1, 0), as there. Every 3x3 conv
is a plain ``nn.Conv2d`` (bias-free, padding 1), so parallel 1x1 adapters can sit beside it and
be merged into its centre tap.

Sizes at width 1 with 10 classes (seed 000 §V gives "22.2 MB", "24.7 MB" with adapters and
"2.58 MB" for the adapter payload; all three are MiB, 2^20 bytes): 5,817,258 parameters, a
state_dict of 22.22 MiB (23.30 MB); 1x1 adapters beside the 25 convs add 645,216 parameters
(24.73 MiB saved); without the frozen 3x3 weights ``torch.save`` writes 2.58 MiB (2.70 MB).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from annotated_types import Gt
from torch import nn

from fedcore.errors import ConfigError
from fedcore.inputs import InputSpec
from fedcore.options import Float
from models.registry import backbone


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class ConvBN(nn.Module):
    """Rebuffi's ``conv_task``: conv3x3 then BatchNorm (adapters add to the conv output)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = conv3x3(cin, cout, stride)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = ConvBN(cin, cout, stride)
        self.conv2 = ConvBN(cout, cout)
        self.downsample = stride != 1 or cin != cout
        if self.downsample:
            if cout != 2 * cin or stride != 2:
                raise ValueError("Rebuffi's shortcut doubles channels and halves resolution")
            # ceil_mode keeps odd sizes (e.g. 7x7 from 28x28 inputs) aligned with the conv.
            self.pool = nn.AvgPool2d(2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(torch.relu(self.conv1(x)))
        if self.downsample:
            r = self.pool(x)
            x = torch.cat((r, torch.zeros_like(r)), dim=1)  # parameter-free shortcut
        return torch.relu(y + x)


class ResNet26(nn.Module):
    classifier_name = "fc"

    def __init__(
        self, *, num_classes: int, in_channels: int, input_size: int, width: float = 1.0
    ) -> None:
        super().__init__()
        if input_size < 8:
            raise ConfigError(f"model 'resnet26' needs input_size >= 8 (got {input_size})")
        # Stage widths are exact multiples of the stem's so the zero-padded shortcut always
        # doubles channels (Rebuffi's int(64*w) etc. agree whenever 32*w is an integer).
        base = max(1, round(32 * width))
        widths = (2 * base, 4 * base, 8 * base)
        self.stem = ConvBN(in_channels, base)
        blocks: list[nn.Module] = []
        cin = base
        for cout in widths:
            for i in range(4):
                blocks.append(BasicBlock(cin, cout, stride=2 if i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.end_bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():  # Rebuffi's init; the linear head keeps PyTorch's default
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))  # (B, 256w, H/8, W/8)
        x = torch.relu(self.end_bn(x))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)  # (B, 256w)
        return self.fc(x)

    def layer_groups(self) -> list[list[str]]:
        return [["stem"], *[[f"blocks.{i}"] for i in range(len(self.blocks))], ["end_bn", "fc"]]


# input_size 72: seed 000 §IV resizes every dataset to 72x72, as Rebuffi's Decathlon does;
# get_model passes its own input_size (default 32); below 8 the three stride-2 stages would
# leave less than one pixel per feature map.
@backbone(input_spec=InputSpec(size=72, note="seed 000 §IV: 72x72"))
def resnet26(
    *,
    num_classes: int,
    in_channels: int = 3,
    input_size: int = 72,
    width: Annotated[Float, Gt(0)] = 1.0,
) -> nn.Module:
    return ResNet26(
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, width=width
    )
