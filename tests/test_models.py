"""Backbone registry: shapes, seed-exact parameter counts, layer groups, errors."""

from __future__ import annotations

import pytest
import torch

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.payload import tensor_nbytes
from models import count_parameters, get_model, list_models

FAST = {"resnet26": {"width": 0.25}}


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize(("c", "size", "classes"), [(1, 28, 10), (3, 32, 10), (3, 32, 100)])
def test_forward_shapes(name, c, size, classes):
    m = get_model(name, num_classes=classes, in_channels=c, input_size=size, **FAST.get(name, {}))
    assert m(torch.randn(2, c, size, size)).shape == (2, classes)


@pytest.mark.parametrize("name", list_models())
def test_layer_groups_cover_every_parameter_once_in_order(name):
    m = get_model(name, num_classes=10, **FAST.get(name, {}))
    groups = m.layer_groups()
    names = [n for n, _ in m.named_parameters()]
    owner = []
    for n in names:
        hits = [i for i, g in enumerate(groups) if any(n == p or n.startswith(p + ".") for p in g)]
        assert len(hits) == 1, n
        owner.append(hits[0])
    assert owner == sorted(owner)  # parameters appear in layer order
    assert getattr(m, m.classifier_name).out_features == 10


@pytest.mark.parametrize("name", list_models())
def test_same_seed_same_weights(name):
    torch.manual_seed(0)
    a = get_model(name, num_classes=10, **FAST.get(name, {})).state_dict()
    torch.manual_seed(0)
    b = get_model(name, num_classes=10, **FAST.get(name, {})).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cifar_cnn_matches_seed_004_table_6_1():
    assert count_parameters(get_model("cifar_cnn", num_classes=10)) == 815_892
    assert count_parameters(get_model("cifar_cnn", num_classes=100)) == 833_262
    assert len(get_model("cifar_cnn", num_classes=10).layer_groups()) == 5


@pytest.mark.parametrize(("norm", "extra"), [("none", 0), ("batch", 2 * 128), ("group", 2 * 128)])
def test_lenet5_norms(norm, extra):
    base = count_parameters(get_model("lenet5", num_classes=10))
    m = get_model("lenet5", num_classes=10, norm=norm)
    assert count_parameters(m) == base + extra
    if norm == "group":
        assert m.norm1.num_groups == 8


def test_resnet26_is_seed_000_size():
    m = get_model("resnet26", num_classes=10, input_size=72)
    assert count_parameters(m) == 5_817_258
    # seed 000 §V: "the payload size is 22.2 MB" -- float32 parameters, in MiB
    assert round(count_parameters(m) * 4 / 2**20, 1) == 22.2
    assert tensor_nbytes(m.state_dict()) > count_parameters(m) * 4  # + BatchNorm buffers
    convs3 = [mod for mod in m.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) and c.bias is None for c in convs3)
    assert len(convs3) == 25  # stem + 12 blocks x 2 (+ head) = ResNet26


def test_bad_model_inputs():
    with pytest.raises(UnknownNameError, match="cifar_cnn"):
        get_model("vgg", num_classes=10)
    with pytest.raises(ConfigError, match="takes no option 'depth'"):
        get_model("cifar_cnn", num_classes=10, depth=3)
    with pytest.raises(ConfigError, match="num_classes"):
        get_model("lenet5", num_classes=1)
    with pytest.raises(ConfigError, match="input_size"):
        get_model("cifar_cnn", num_classes=10, input_size=8)
    with pytest.raises(ConfigError, match="norm"):
        get_model("lenet5", num_classes=10, norm="layer")
