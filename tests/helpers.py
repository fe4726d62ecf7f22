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


class Float64Images(ImageData):
    """Images served as float64 batches (for float64 models: exact comparisons)."""

    def batch(self, idx, **kw):  # type: ignore[no-untyped-def]
        x, y = super().batch(idx, **kw)
        return x.double(), y


def images64(n: int, seed: int) -> Float64Images:
    """``toy_data(n, seed)`` as float64 batches."""
    d = toy_data(n, seed=seed)
    return Float64Images(d.images, d.labels, (0.5,), (0.25,))


class TinyAdaptable(nn.Module):
    """3x3 convs of every alignment the residual merge must respect (padding 1, stride 2,
    padding 0 with a bias, padding 2 with groups), BatchNorm and a linear head; 12x12 in."""

    classifier_name = "fc"

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=0)
        self.conv4 = nn.Conv2d(8, 8, 3, padding=2, groups=2)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))  # (B, 4, 12, 12)
        x = torch.relu(self.bn2(self.conv2(x)))  # (B, 8, 6, 6)
        x = torch.relu(self.conv3(x))  # (B, 8, 4, 4)
        x = torch.relu(self.conv4(x))  # (B, 8, 6, 6)
        return self.fc(x.mean((2, 3)))

    def layer_groups(self) -> list[list[str]]:
        return [["conv1", "bn1"], ["conv2", "bn2"], ["conv3"], ["conv4"], ["fc"]]


def tiny_adaptable(num_classes: int = 2) -> nn.Module:
    return TinyAdaptable(num_classes)


def tiny_adapted(adapter: str, num_classes: int = 2) -> nn.Module:
    from models.adapters import adapt

    return adapt(TinyAdaptable(num_classes), adapter)
