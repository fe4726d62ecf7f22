"""What a backbone expects of its input, and the one function that turns stored images into it.

A backbone declares an :class:`InputSpec` (size, channels, normalisation); a field left None
means "whatever the dataset has". :func:`resolve_input` combines it with the dataset's shape
and statistics (and an optional ``model.input_size`` override) into a concrete
:class:`ModelInput`, and :func:`to_model_input` applies that to a batch of stored uint8 images.

Why per batch and not once at load: images stay uint8 at their stored size (FashionMNIST:
784 bytes each), so a 224x224 backbone costs no extra memory (12k training images as 3x224x224
float32 would be 7.2 GB, as uint8 1.8 GB), and the training set is still indexed straight from
the preloaded tensor. Resizing a batch is cheap next to the backbone: measured here (1 thread),
a 32-image batch 28x28 -> 72x72 takes 0.7 ms against about 9 s for a ResNet26 training step
on it; 28x28 -> 224x224 takes 6 ms. Bilinear interpolation on CPU is deterministic, so the same
rows give the same inputs bit for bit, whatever the process.

Grayscale for 3-channel pretrained stems: the channel is repeated (``expand``: a view, no copy)
before the per-channel normalisation, which is what a pretrained RGB stem saw for a gray image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedcore.errors import ConfigError

MAX_INPUT_SIZE = 1024

# ImageNet statistics of pixel/255 (torchvision's ResNet weights were trained with them).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class InputSpec:
    """A backbone's input needs; None = keep the dataset's own."""

    size: int | None = None  # square side length the backbone is meant for
    channels: int | None = None  # 3 for an RGB-pretrained stem; gray data is repeated to it
    mean: tuple[float, ...] | None = None  # of pixel/255; one value = the same for every channel
    std: tuple[float, ...] | None = None
    note: str = ""  # where the numbers come from (shown in errors and docs)


@dataclass(frozen=True)
class ModelInput:
    """Concrete input of one experiment: every batch is (B, channels, size, size) float32."""

    size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.size, self.size)


def _per_channel(values: tuple[float, ...], channels: int, what: str) -> tuple[float, ...]:
    if len(values) == channels:
        return tuple(float(v) for v in values)
    if len(values) == 1:
        return (float(values[0]),) * channels
    raise ConfigError(f"{what} has {len(values)} values for {channels} channels")


def resolve_input(
    spec: InputSpec,
    data_shape: tuple[int, int, int],
    data_mean: tuple[float, ...],
    data_std: tuple[float, ...],
    size: int | None = None,
    *,
    model: str = "model",
) -> ModelInput:
    """The input a backbone gets from a dataset of ``data_shape`` (C, H, W).

    ``size`` (``model.input_size``) overrides the backbone's size; None keeps the spec's, or
    the dataset's when the spec has none. Non-square data is resized to a square input.
    """
    c, h, w = data_shape
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_INPUT_SIZE:
            raise ConfigError(
                f"model.input_size must be an integer in [1, {MAX_INPUT_SIZE}] or null (got {size!r})"
            )
    side = size or spec.size or (h if h == w else max(h, w))
    channels = spec.channels or c
    if c not in (1, channels):
        raise ConfigError(
            f"model {model!r} takes {channels}-channel input; the dataset has {c} channels "
            f"(only 1-channel data is converted, by repeating the gray channel)"
        )
    if spec.mean is not None and spec.std is not None:  # the backbone's own statistics
        mean, std = spec.mean, spec.std
    else:  # the dataset's, repeated when gray data feeds an RGB stem
        mean, std = data_mean, data_std
    mean = _per_channel(mean, channels, f"model {model!r} input mean")
    std = _per_channel(std, channels, f"model {model!r} input std")
    return ModelInput(side, channels, mean, std)


def to_model_input(x: torch.Tensor, size: int | None, channels: int | None) -> torch.Tensor:
    """(B, C, H, W) float images in [0, 1] -> (B, channels, size, size), not yet normalised."""
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        # Antialias only when shrinking (upsampling is plain bilinear either way), as PIL's
        # and torchvision's Resize do for uint8 images.
        shrink = x.shape[-1] > size or x.shape[-2] > size
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink
        )
    if channels is not None and x.shape[1] != channels:
        x = x.expand(-1, channels, -1, -1)  # (B, 1, S, S) -> (B, 3, S, S), a view
    return x
