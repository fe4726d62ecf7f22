"""Small CNNs of the seeds: the CIFAR CNN (seed 004 Table 6.1) and LeNet5 (seed 002 §4)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from fedcore.errors import ConfigError
from models.registry import backbone

# The allowed values of the options (the annotations ``model.options`` is validated against).
Init = Literal["pytorch", "seed004"]  # CifarCNN's initialisation (see _seed004_init)
Norm = Literal["none", "batch", "group"]  # LeNet5's norm after each conv


def _conv_out(size: int, name: str) -> int:
    """Spatial size after conv5 -> pool2 -> conv5 -> pool2."""
    s = ((size - 4) // 2 - 4) // 2
    if s < 1:
        raise ConfigError(f"model {name!r} needs input_size >= 16 (got {size})")
    return s


class CifarCNN(nn.Module):
    """Seed 004 §6.1.2, Table 6.1: two 5x5 convs (64 filters) + three linear layers.

    Returns logits: the table ends in LogSoftmax + NLL loss, which equals ``cross_entropy`` on
    logits, so the loss applies the softmax and the model stays usable for merging and eval.
    815,892 parameters for 3x32x32 inputs and 10 classes (833,262 with 100).
    """

    classifier_name = "fc3"

    def __init__(
        self, *, num_classes: int, in_channels: int, input_size: int, init: Init = "pytorch"
    ) -> None:
        super().__init__()
        s = _conv_out(input_size, "cifar_cnn")
        self.conv1 = nn.Conv2d(in_channels, 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * s * s, 394)
        self.fc2 = nn.Linear(394, 192)
        self.fc3 = nn.Linear(192, num_classes)
        if init == "seed004":
            self._seed004_init()

    def _seed004_init(self) -> None:
        # Seed 004 §6.1.2 "Weights initialization", literally. Conv weights ~ N(0, 2/sqrt(5*5*64))
        # for both convs (the seed says 5x5 and 64 channels are "shared between both"); we read
        # the second argument as the standard deviation, 0.05 -- close to He's sqrt(2/1600) =
        # 0.035, whereas as a variance it would give a std of 0.22. Conv biases zero. Linear
        # weights and biases ~ U[-s, s] with s = 1/sqrt(#weights of the layer), the seed's
        # "630400, 75684 and 1920" (75684 is a transposition of Table 6.1's 75648 = 394*192):
        # the layer's weight count, not its fan-in, so the head starts ~600x smaller than
        # PyTorch's default. On FashionMNIST that stalls FedAvg at chance for the first rounds
        # (measured: 10% test accuracy after 4 rounds at lr 0.01), hence opt-in.
        for conv in (self.conv1, self.conv2):
            nn.init.normal_(conv.weight, 0.0, 2.0 / math.sqrt(5 * 5 * 64))
            assert conv.bias is not None
            nn.init.zeros_(conv.bias)
        for fc in (self.fc1, self.fc2, self.fc3):
            s = 1.0 / math.sqrt(fc.weight.numel())
            nn.init.uniform_(fc.weight, -s, s)
            nn.init.uniform_(fc.bias, -s, s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))  # (B, 64, (H-4)/2, ...)
        x = self.pool(torch.relu(self.conv2(x)))  # (B, 64, s, s)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)  # (B, num_classes)

    def layer_groups(self) -> list[list[str]]:
        """The L=5 layers FedNILO freezes in order (seed 004 §5.2.3)."""
        return [["conv1"], ["conv2"], ["fc1"], ["fc2"], ["fc3"]]


class LeNet5(nn.Module):
    """Seed 002 "Models Networks": conv(64,5)-pool-conv(64,5)-pool-fc384-fc192-fc.

    The seed lists only "3 Fully Connected layers"; the 384 and 192 widths are those of the
    network it cites ([2] Hsu et al., the TensorFlow CIFAR-10 tutorial net FedOpt also uses).
    Seed 004's Table 6.1 is the same net with 394 hidden units (its total confirms 394).
    Optional BatchNorm or GroupNorm (8 groups of the 64 channels, seed 002 §4) after each conv.
    """

    classifier_name = "fc3"

    def __init__(
        self, *, num_classes: int, in_channels: int, input_size: int, norm: Norm = "none"
    ) -> None:
        super().__init__()
        s = _conv_out(input_size, "lenet5")
        self.conv1 = nn.Conv2d(in_channels, 64, 5)
        self.norm1 = self._norm(norm)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.norm2 = self._norm(norm)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * s * s, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    @staticmethod
    def _norm(kind: Norm) -> nn.Module:
        if kind == "batch":
            return nn.BatchNorm2d(64)
        if kind == "group":
            return nn.GroupNorm(8, 64)
        return nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.norm1(self.conv1(x))))
        x = self.pool(torch.relu(self.norm2(self.conv2(x))))
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)

    def layer_groups(self) -> list[list[str]]:
        return [["conv1", "norm1"], ["conv2", "norm2"], ["fc1"], ["fc2"], ["fc3"]]


@backbone()
def cifar_cnn(
    *, num_classes: int, in_channels: int = 3, input_size: int = 32, init: Init = "pytorch"
) -> nn.Module:
    return CifarCNN(
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, init=init
    )


@backbone()
def lenet5(
    *, num_classes: int, in_channels: int = 3, input_size: int = 32, norm: Norm = "none"
) -> nn.Module:
    return LeNet5(
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm=norm
    )
