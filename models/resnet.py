"""ResNet26 of Rebuffi et al. (residual adapters, Visual Decathlon), the base of seed 000.

Follows Rebuffi's ``res_adapt`` code: a 3x3 stem conv to 32*w channels with BatchNorm, three
stages of four BasicBlocks with 64*w, 128*w, 256*w channels, each stage starting with a
stride-2 block whose shortcut is parameter-free (2x2 average pooling, then zero channels
concatenated), BatchNorm + ReLU, global average pooling and a linear head. Every 3x3 conv is
a plain ``nn.Conv2d`` (bias-free, padding 1), so parallel 1x1 adapters can sit beside it and
be merged into its centre tap. At width 1 with 10 classes the float32 weights take 22.2 MiB,
the "22.2 MB" of seed 000 §V.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcore.errors import ConfigError
from models.registry import register_model


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
        if width <= 0:
            raise ConfigError(f"model.options.width must be > 0 (got {width})")
        if input_size < 8:
            raise ConfigError(f"model 'resnet26' needs input_size >= 8 (got {input_size})")
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))  # (B, 256w, H/8, W/8)
        x = torch.relu(self.end_bn(x))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)  # (B, 256w)
        return self.fc(x)

    def layer_groups(self) -> list[list[str]]:
        return [["stem"], *[[f"blocks.{i}"] for i in range(len(self.blocks))], ["end_bn", "fc"]]


@register_model("resnet26")
def resnet26(
    *, num_classes: int, in_channels: int = 3, input_size: int = 72, width: float = 1.0
) -> nn.Module:
    return ResNet26(
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, width=width
    )
