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


def toy_data(n: int = 400, seed: int = 0) -> ImageData:
    """12x12 grayscale images whose label is 'brighter than average' (learnable, 2 classes)."""
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, 1, 12, 12, generator=g) * 255).to(torch.uint8)
    labels = (images.float().mean((1, 2, 3)) > 127.5).long()
    return ImageData(images, labels, (0.5,), (0.25,))
