"""Backbone input specs: resolution against a dataset, per-batch resize and gray -> RGB."""

from __future__ import annotations

import pytest
import torch

from fedcore.client import ImageData
from fedcore.errors import ConfigError
from fedcore.inputs import IMAGENET_MEAN, IMAGENET_STD, InputSpec, resolve_input, to_model_input
from models import input_spec

FMNIST = ((1, 28, 28), (0.2860,), (0.3530,))
CIFAR = ((3, 32, 32), (0.49, 0.48, 0.45), (0.25, 0.24, 0.26))


def test_scratch_models_keep_the_data_as_it_is():
    for name in ("cifar_cnn", "lenet5"):
        got = resolve_input(input_spec(name), *FMNIST)
        assert (got.size, got.channels, got.mean, got.std) == (28, 1, (0.2860,), (0.3530,))


def test_resnet26_is_resized_to_72_as_in_seed_000():
    got = resolve_input(input_spec("resnet26"), *FMNIST)
    assert got.shape == (1, 72, 72) and got.mean == (0.2860,)
    assert resolve_input(input_spec("resnet26"), *FMNIST, size=32).shape == (1, 32, 32)


def test_rgb_pretrained_stems_get_gray_repeated_and_imagenet_statistics():
    spec = InputSpec(size=224, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    got = resolve_input(spec, *FMNIST)
    assert (got.shape, got.mean, got.std) == ((3, 224, 224), IMAGENET_MEAN, IMAGENET_STD)
    assert resolve_input(spec, *CIFAR, size=64).shape == (3, 64, 64)
    lite = resolve_input(input_spec("efficientnet_lite0"), *CIFAR)
    assert lite.shape == (3, 224, 224) and lite.mean == (127 / 255,) * 3
    scratch = resolve_input(input_spec("efficientnet_lite0", pretrained=False), *FMNIST)
    assert scratch.shape == (1, 28, 28)
    # A channel spec without statistics repeats the data's own.
    assert resolve_input(InputSpec(channels=3), *FMNIST).mean == (0.2860,) * 3


@pytest.mark.parametrize("bad", [0, -3, 2000, 1.5, True, "big"])
def test_bad_input_size_is_one_line(bad):
    with pytest.raises(ConfigError, match=r"^model.input_size must be an integer in \[1, 1024\]"):
        resolve_input(input_spec("resnet26"), *FMNIST, size=bad)


def test_rgb_data_on_a_gray_model_is_refused():
    with pytest.raises(ConfigError, match="takes 1-channel input; the dataset has 3 channels"):
        resolve_input(InputSpec(channels=1), *CIFAR, model="gray")
    with pytest.raises(ConfigError, match="mean has 2 values for 3 channels"):
        resolve_input(InputSpec(mean=(0.1, 0.2), std=(1.0,)), *CIFAR)


def test_to_model_input_resizes_and_repeats():
    x = torch.rand(4, 1, 28, 28)
    y = to_model_input(x, 72, 3)
    assert y.shape == (4, 3, 72, 72) and torch.equal(y[:, 0], y[:, 2])
    assert to_model_input(x, 28, None) is x  # nothing to do: the same tensor
    assert to_model_input(x, 14, None).shape == (4, 1, 14, 14)  # shrinking antialiases
    flat = torch.full((1, 1, 28, 28), 0.25)
    assert torch.allclose(to_model_input(flat, 72, None), torch.full((1, 1, 72, 72), 0.25))


def test_image_data_batches_in_the_backbone_input_deterministically():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 1, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.arange(10)
    spec = resolve_input(
        InputSpec(size=72, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD), *FMNIST
    )
    data = ImageData(images, labels, spec.mean, spec.std, size=spec.size, channels=spec.channels)
    idx = torch.tensor([3, 1])
    x, y = data.batch(idx)
    assert x.shape == (2, 3, 72, 72) and y.tolist() == [3, 1]
    assert torch.equal(x, data.batch(idx)[0])  # bit-identical on every access
    # Channel c is (resized gray - mean_c) / std_c: undo it and the channels agree.
    raw = x * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(
        1, 3, 1, 1
    )
    assert torch.allclose(raw[:, 0], raw[:, 1], atol=1e-5)
    assert images.shape == (10, 1, 28, 28)  # storage stays uint8 at the stored size


def test_evaluation_batches_shrink_with_the_input_size():
    from fedcore.client import evaluate

    seen: list[int] = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(x.shape[0])
            return torch.zeros(x.shape[0], 2)

    images = torch.zeros(50, 1, 28, 28, dtype=torch.uint8)
    labels = torch.zeros(50, dtype=torch.int64)
    big = ImageData(images, labels, (0.5,) * 3, (0.5,) * 3, size=224, channels=3)
    assert evaluate(Probe(), {}, big) == (50, pytest.approx(50 * 0.693147, rel=1e-5), 50)
    assert seen == [20, 20, 10]  # 1000 * 32^2 / 224^2 = 20 images per batch
    seen.clear()
    evaluate(Probe(), {}, ImageData(images, labels, (0.5,), (0.5,)))
    assert seen == [50]  # stored size: the usual 1000-image batches


@pytest.mark.parametrize(
    ("spec", "size", "channels"),
    [
        (InputSpec(size=72), 72, 1),  # resnet26: upsampled
        (InputSpec(size=16, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD), 16, 3),  # shrunk
        (InputSpec(), 28, 1),  # scratch CNNs: as stored
    ],
)
def test_serving_model_applies_the_training_input_step(spec, size, channels):
    """The registered model takes stored images (pixel/255) and gives the backbone exactly
    the batch training gave it."""
    from models.serving import ImageServing

    torch.manual_seed(0)
    images = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    inp = resolve_input(spec, *FMNIST)
    data = ImageData(
        images, torch.zeros(5, dtype=torch.int64), inp.mean, inp.std, size=size, channels=channels
    )
    backbone = torch.nn.Sequential(torch.nn.Conv2d(channels, 4, 3), torch.nn.Flatten())
    x, _ = data.batch(torch.arange(5))
    served = ImageServing(backbone, inp).eval()
    with torch.no_grad():
        assert torch.equal(served(images.float() / 255.0), backbone(x))
