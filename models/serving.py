"""The model users get from the registry: images as stored in, class logits out.

Training feeds the backbone batches that :mod:`fedcore.inputs` resized, repeated to the stem's
channels and normalised (``fedcore.client.ImageData.batch``). A registered model that expected
those tensors would make every user re-implement that step, with the experiment's exact size
and statistics. :class:`ImageServing` folds it into the model: it takes float images in [0, 1]
with the dataset's own channels and size (FashionMNIST: ``(B, 1, 28, 28)``, pixel/255) and
applies the same ``to_model_input`` and normalisation as training, so its logits equal the
backbone's on the training pipeline's batches. The backbone inside is the merged plain model.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcore.inputs import ModelInput, to_model_input


class ImageServing(nn.Module):
    """``backbone`` preceded by the experiment's input step (resize, gray->RGB, normalise)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, backbone: nn.Module, inp: ModelInput) -> None:
        super().__init__()
        self.backbone = backbone
        self.size, self.channels = inp.size, inp.channels
        shape = (1, inp.channels, 1, 1)
        self.register_buffer("mean", torch.tensor(inp.mean, dtype=torch.float32).view(shape))
        self.register_buffer("std", torch.tensor(inp.std, dtype=torch.float32).view(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_model_input(x, self.size, self.channels)
        return self.backbone((x - self.mean) / self.std)
