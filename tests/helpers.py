"""Small, picklable builders shared by tests (worker processes import them by name)."""

from __future__ import annotations

import torch
from torch import nn

from fedcore.client import ImageData


def tiny_cnn(num_classes: int = 2) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 10 * 10, num_classes),
    )


class TinyLayered(nn.Module):
    """A 3-layer net with ``layer_groups()`` (FedNILO's unit of freezing), BatchNorm included."""

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 5 * 5, 16)
        self.fc2 = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)  # (B, 4, 5, 5)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))

    def layer_groups(self) -> list[list[str]]:
        return [["conv1", "bn1"], ["fc1"], ["fc2"]]


def tiny_layered(num_classes: int = 2) -> nn.Module:
    return TinyLayered(num_classes)


def toy_data(n: int = 400, seed: int = 0, *, channels: int = 1, size: int = 12) -> ImageData:
    """size x size images whose label is 'brighter than average' (learnable, 2 classes)."""
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, channels, size, size, generator=g) * 255).to(torch.uint8)
    labels = (images.float().mean((1, 2, 3)) > 127.5).long()
    return ImageData(images, labels, (0.5,) * channels, (0.25,) * channels)
