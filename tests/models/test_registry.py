"""Backbone registry: shapes, seed-exact parameter counts, layer groups, init, errors."""

from __future__ import annotations

import math
import pickle
import re

import pytest
import torch

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.payload import tensor_nbytes
from flows.cli import app
from models import (
    backbone,
    count_parameters,
    get_model,
    input_spec,
    list_models,
    model_options,
)
from models import registry as model_registry
from models.text import is_text_model
from tests.cli_contract import REPO, assert_one_clear_line, runner

FAST = {"resnet26": {"width": 0.25}}  # keeps every parametrized case well under a second
FAST.update({v: {"patch_size": 4, "depth": 2} for v in ("vit_small", "deit_small", "vit_base")})
MIN_SIZE = {"cifar_cnn": 16, "lenet5": 16, "resnet26": 8, "efficientnet_lite0": 16}
MIN_SIZE.update({v: 4 for v in ("vit_small", "deit_small", "vit_base")})  # one 4-pixel patch
MIN_SIZE.update({f"tv_resnet{d}": 16 for d in (18, 34, 50)})  # pretrained: false by default


# Image backbones; text ones (models.text: minilm, text_hf) are tested in tests/fedcore/test_text.py.
IMAGE_MODELS = [m for m in list_models() if not is_text_model(m)]


def build(name: str, **kw):
    return get_model(name, **{"num_classes": 10, **FAST.get(name, {}), **kw})


def group_of(groups: list[list[str]], param: str) -> list[int]:
    return [
        i for i, g in enumerate(groups) if any(param == p or param.startswith(p + ".") for p in g)
    ]


def test_registry_lists_the_seed_backbones():
    assert {"cifar_cnn", "lenet5", "resnet26"} <= set(list_models())
    assert list_models() == sorted(list_models())


@pytest.mark.parametrize("name", IMAGE_MODELS)
@pytest.mark.parametrize(("c", "size", "classes"), [(1, 28, 10), (3, 32, 10), (3, 32, 100)])
def test_forward_shapes(name, c, size, classes):
    m = build(name, num_classes=classes, in_channels=c, input_size=size)
    assert m(torch.randn(2, c, size, size)).shape == (2, classes)
    head = getattr(m, m.classifier_name)
    assert isinstance(head, torch.nn.Linear) and head.out_features == classes


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_layer_groups_cover_every_parameter_once_in_forward_order(name):
    m = build(name)
    groups = m.layer_groups()
    owner = {}
    for n, _ in m.named_parameters():
        hits = group_of(groups, n)
        assert len(hits) == 1, f"{n} is in groups {hits}"
        owner[n] = hits[0]
    assert set(owner.values()) == set(range(len(groups)))  # no empty group

    # Forward order: the modules holding parameters run in non-decreasing group order.
    calls: list[int] = []
    for mod_name, mod in m.named_modules():
        own = [f"{mod_name}.{p}" if mod_name else p for p, _ in mod.named_parameters(recurse=False)]
        if own:
            mod.register_forward_pre_hook(lambda *_, g=owner[own[0]]: calls.append(g))
    m(torch.randn(2, 3, 32, 32))
    assert calls == sorted(calls) and set(calls) == set(range(len(groups)))


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_same_seed_same_weights(name):
    torch.manual_seed(0)
    a = build(name).state_dict()
    torch.manual_seed(0)
    b = build(name).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(1)
    c = build(name).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_cifar_cnn_matches_seed_004_table_6_1():
    assert count_parameters(get_model("cifar_cnn", num_classes=10)) == 815_892
    assert count_parameters(get_model("cifar_cnn", num_classes=100)) == 833_262
    m = get_model("cifar_cnn", num_classes=10)
    assert m.layer_groups() == [["conv1"], ["conv2"], ["fc1"], ["fc2"], ["fc3"]]
    assert m.fc1.in_features == 64 * 5 * 5
    assert get_model("cifar_cnn", num_classes=10, in_channels=1, input_size=28).fc1.in_features == (
        64 * 4 * 4
    )


def test_cifar_cnn_seed_004_init():
    torch.manual_seed(0)
    m = get_model("cifar_cnn", num_classes=10, init="seed004")
    # Conv weights ~ N(0, std 2/sqrt(5*5*64) = 0.05); 102,400 draws give the std to ~0.2%.
    assert m.conv2.weight.std().item() == pytest.approx(0.05, rel=0.02)
    assert m.conv1.bias.abs().sum() == 0 and m.conv2.bias.abs().sum() == 0
    for fc, n_weights in ((m.fc1, 630_400), (m.fc2, 75_648), (m.fc3, 1_920)):
        s = 1 / math.sqrt(n_weights)
        assert 0.99 * s < fc.weight.abs().max().item() <= s  # >= 1,920 draws reach the edge
        assert fc.bias.abs().max().item() <= s  # same bound (fc3 has only 10 biases)


@pytest.mark.parametrize(("norm", "extra"), [("none", 0), ("batch", 2 * 128), ("group", 2 * 128)])
def test_lenet5_norms(norm, extra):
    base = count_parameters(get_model("lenet5", num_classes=10))
    # Hand count, 3x32x32: 4,864 + 102,464 + 1600*384+384 + 384*192+192 + 192*10+10.
    assert base == 4_864 + 102_464 + 614_784 + 73_920 + 1_930
    m = get_model("lenet5", num_classes=10, norm=norm)
    assert count_parameters(m) == base + extra  # affine weight + bias per channel, 2 x 64 each
    kind = {"none": torch.nn.Identity, "batch": torch.nn.BatchNorm2d, "group": torch.nn.GroupNorm}
    assert isinstance(m.norm1, kind[norm]) and isinstance(m.norm2, kind[norm])
    if norm == "group":
        assert m.norm1.num_groups == m.norm2.num_groups == 8
    assert [g[0] for g in m.layer_groups()] == ["conv1", "conv2", "fc1", "fc2", "fc3"]


def test_resnet26_is_seed_000_size():
    m = get_model("resnet26", num_classes=10, input_size=72)  # width 1, no forward (slow)
    assert count_parameters(m) == 5_817_258
    # seed 000 §V: "the payload size is 22.2 MB": 5,817,258 float32 = 22.19 MiB (23.27 MB);
    # the whole state_dict with BatchNorm buffers is 22.22 MiB (23.30 MB). The seed's MB are MiB.
    assert round(count_parameters(m) * 4 / 2**20, 1) == 22.2
    assert round(tensor_nbytes(m.state_dict()) / 2**20, 2) == 22.22
    convs = [mod for mod in m.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert len(convs) == 25  # stem + 12 blocks x 2; with the linear head: 26 layers
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) and c.bias is None for c in convs)
    # Rebuffi's res_adapt: every stage, the first included, opens with a stride-2 block.
    strided = [i for i, b in enumerate(m.blocks) if b.conv1.conv.stride == (2, 2)]
    assert strided == [0, 4, 8]
    assert [b.conv2.conv.out_channels for b in m.blocks[::4]] == [64, 128, 256]
    assert len(m.layer_groups()) == 14 and m.classifier_name == "fc"


def test_resnet26_rebuffi_init_and_width():
    torch.manual_seed(0)
    m = get_model("resnet26", num_classes=10, width=0.5)
    conv = m.blocks[8].conv2.conv  # 128 -> 128: 147,456 draws
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * 128)), rel=0.02)
    assert [b.conv1.conv.out_channels for b in m.blocks[::4]] == [32, 64, 128]
    assert m.stem.conv.out_channels == 16 and m.fc.in_features == 128


def tiny(*, num_classes: int, in_channels: int = 3, input_size: int = 32, bias: bool = True):
    return torch.nn.Linear(in_channels * input_size**2, num_classes, bias=bias)


backbone()(tiny)  # a module-level builder, as a model module has them


def test_a_model_is_a_line_of_the_table_and_a_decorated_builder(monkeypatch):
    table = {**model_registry.MODELS, "tiny": model_registry.ModelEntry(f"{__name__}:tiny")}
    monkeypatch.setattr(model_registry, "MODELS", table)
    assert "tiny" in list_models() and model_options("tiny") == ["bias"]
    assert get_model("tiny", num_classes=3, input_size=2, bias=False).bias is None
    assert pickle.loads(pickle.dumps(tiny.Options(bias=False))) == tiny.Options(bias=False)


def test_every_entry_names_a_decorated_builder_of_its_name():
    for name, entry in model_registry.MODELS.items():
        fn = model_registry.builder(name)
        assert entry.builder.endswith(f":{name}") and fn.__name__ == name, name
        assert fn.Options.__qualname__ == f"{name}.Options", name
        assert (fn.tokenizer is None) == (entry.task == "image"), name


def test_importing_models_imports_no_backbone():
    """``import models`` (and the config, which lists the models) loads no builder module and
    none of their heavy dependencies: a run imports only its own model's (this cost GPU time
    once, when an unused backbone's package failed to import on a GPU machine)."""
    import subprocess
    import sys

    code = "import sys, models, tasks.config; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    modules = {e.builder.split(":")[0] for e in model_registry.MODELS.values()}
    # the config's default model (cifar_cnn) is the one backbone it builds options for
    assert sorted(modules & set(out)) == ["models.cnn"], out
    assert not [m for m in out if m.startswith(("efficientnet_lite", "timm", "peft"))], out


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_bad_common_arguments(name):
    with pytest.raises(ConfigError, match=r"num_classes.*\(got 1\)"):
        build(name, num_classes=1)
    with pytest.raises(ConfigError, match=r"in_channels.*\(got 0\)"):
        build(name, in_channels=0)
    with pytest.raises(ConfigError, match=rf"'{name}' needs input_size >= {MIN_SIZE[name]}"):
        build(name, input_size=MIN_SIZE[name] - 1)
    build(name, input_size=MIN_SIZE[name])  # the smallest size is accepted


def test_bad_model_names():
    with pytest.raises(
        UnknownNameError,
        match="unknown model 'vgg'; valid: cifar_cnn, deit_small, efficientnet_lite0, gpt2_hf, gpt2_small, lenet5",
    ):
        get_model("vgg", num_classes=10)
    with pytest.raises(UnknownNameError, match="unknown model 'vgg'"):
        model_registry.model_options_type("vgg")


INF = float("inf")


# Every option is checked against its builder's annotations before anything is built (so the
# pretrained and text models below fail fast too), with one line naming model.options.<key>.
@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("cifar_cnn", {"depth": 3}, "unknown key 'model.options.depth'; allowed: init"),
        ("lenet5", {"width": 2}, "unknown key 'model.options.width'; allowed: norm"),
        ("vit_small", {"foo": 1}, "unknown key 'model.options.foo'; allowed: pretrained, patch_size, depth, embed_dim"),
        ("tv_resnet18", {"depth": 2}, "unknown key 'model.options.depth'; allowed: pretrained"),
        ("lenet5", {"norm": "layer"}, "model.options.norm: must be 'none', 'batch' or 'group' (got 'layer')"),
        ("cifar_cnn", {"init": "xavier"}, "model.options.init: must be 'pytorch' or 'seed004' (got 'xavier')"),
        ("resnet26", {"width": 0}, "model.options.width: must be greater than 0 (got 0)"),
        ("resnet26", {"width": -1.0}, "model.options.width: must be greater than 0 (got -1.0)"),
        ("resnet26", {"width": "wide"}, "model.options.width: must be a valid number (got 'wide')"),
        ("resnet26", {"width": True}, "model.options.width: must be a valid number (got True)"),
        ("resnet26", {"width": INF}, "model.options.width: must be a finite number (got inf)"),
        ("vit_small", {"patch_size": "16"}, "model.options.patch_size: must be a valid integer (got '16')"),
        ("vit_small", {"patch_size": True}, "model.options.patch_size: must be a valid integer (got True)"),
        ("vit_small", {"patch_size": 2.5}, "model.options.patch_size: must be a valid integer (got 2.5)"),
        ("vit_small", {"patch_size": 0}, "model.options.patch_size: must be greater than or equal to 1 (got 0)"),
        ("deit_small", {"depth": 0}, "model.options.depth: must be greater than or equal to 1 (got 0)"),
        ("vit_base", {"depth": "2"}, "model.options.depth: must be a valid integer (got '2')"),
        ("vit_small", {"pretrained": 1}, "model.options.pretrained: must be a valid boolean (got 1)"),
        ("tv_resnet18", {"pretrained": "yes"}, "model.options.pretrained: must be a valid boolean (got 'yes')"),
        ("efficientnet_lite0", {"pretrained": 0}, "model.options.pretrained: must be a valid boolean (got 0)"),
        ("minilm", {"max_length": 1000}, "model.options.max_length: must be less than or equal to 512 (got 1000)"),
        ("minilm", {"max_length": 1}, "model.options.max_length: must be greater than or equal to 2 (got 1)"),
        ("minilm", {"max_length": 64.0}, "model.options.max_length: must be a valid integer (got 64.0)"),
        ("minilm", {"pooling": "max"}, "model.options.pooling: must be 'cls' or 'mean' (got 'max')"),
        ("text_hf", {"hf_name": 3}, "model.options.hf_name: must be a valid string (got 3)"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line(name, options, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        get_model(name, num_classes=10, **options)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        input_spec(name, **options)  # the same path, the same line


def test_vit_rules_between_options_and_input_stay_in_the_builder():
    with pytest.raises(ConfigError, match="'vit_small': the ImageNet weights have 12 blocks"):
        get_model("vit_small", num_classes=10, pretrained=True, depth=2)  # before any download
    with pytest.raises(ConfigError, match=r"16-pixel patches \(got patch_size 8\)"):
        get_model("deit_small", num_classes=10, pretrained=True, patch_size=8)
    with pytest.raises(ConfigError, match="multiple of its 4-pixel patch .got 30; e.g. .* 32"):
        get_model("vit_base", num_classes=10, input_size=30, patch_size=4, depth=1)


def test_typed_options_are_accepted():
    kind = model_registry.model_options_type("vit_small")
    assert model_options("vit_small") == ["pretrained", "patch_size", "depth", "embed_dim"]
    assert (kind().pretrained, kind().patch_size, kind().depth) == (False, 16, None)
    assert kind().embed_dim is None

    def vit(**kw):
        torch.manual_seed(0)
        return get_model("vit_small", num_classes=10, input_size=16, **kw)

    typed = vit(options=kind(patch_size=4, depth=2))
    assert len(typed.blocks) == 2 and typed.patch_embed.proj.kernel_size == (4, 4)
    for other in (vit(options={"patch_size": 4}, depth=2), vit(patch_size=4, depth=2)):
        a, b = typed.state_dict(), other.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # keywords win over the instance, and the result is checked again (an instance may be
    # hand-made: dataclasses do not validate)
    assert len(vit(options=kind(patch_size=4, depth=2), depth=1).blocks) == 1
    with pytest.raises(ConfigError, match="^model.options.depth: must be greater than or equal"):
        vit(options=kind(depth=0))
    cnn_options = model_registry.model_options_type("cifar_cnn")()
    with pytest.raises(ConfigError, match=r"^model.options: must be a mapping .*cifar_cnn.Opt"):
        vit(options=cnn_options)
    lite = model_registry.model_options_type("efficientnet_lite0")
    assert input_spec("efficientnet_lite0", options=lite(pretrained=False)).size is None
    assert input_spec("efficientnet_lite0", options=lite()).size == 224  # the builder's default
    assert get_model("resnet26", num_classes=10, width=1).fc.in_features == 256  # int is a float


def test_vit_embed_dim_builds_a_narrower_vit_with_64_channels_per_head():
    """The cpu stand-ins for DeiT-S (seed 001): ViT-Ti's 192 and narrower, one head per 64."""
    vit = get_model("vit_small", num_classes=10, in_channels=1, input_size=28, patch_size=14,
                    depth=2, embed_dim=128)  # fmt: skip
    assert vit.hidden_size == 128 and vit.blocks[0].attn.num_heads == 2
    assert vit(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    with pytest.raises(ConfigError, match="^model 'vit_small': embed_dim must be a multiple of 64"):
        get_model("vit_small", num_classes=10, input_size=16, patch_size=4, embed_dim=100)
    with pytest.raises(ConfigError, match="^model 'deit_small': the ImageNet weights are 384 wide"):
        get_model("deit_small", num_classes=10, pretrained=True, embed_dim=192)
    with pytest.raises(
        ConfigError, match="^model.options.embed_dim: must be greater than or equal"
    ):
        get_model("vit_small", num_classes=10, input_size=16, options={"embed_dim": 32})


@pytest.mark.parametrize("name", list_models())
def test_options_types_pickle(name):
    """Options travel to worker processes inside the params: by reference, as <builder>.Options."""
    kind = model_registry.model_options_type(name)
    assert kind.__qualname__ == f"{name}.Options"
    options = kind()
    assert pickle.loads(pickle.dumps(options)) == options


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--num-classes", "0"], "--num-classes: must be in [2, 1000000] (got 0)"),
        (["--num-classes", str(2**64)], f"--num-classes: must be in [2, 1000000] (got {2**64})"),
        (["--input-shape", f"3,{2**40},{2**40}"], "--input-shape: C in [1, 64] and H = W in"),
        (["--input-shape", "0,32,32"], "--input-shape: C in [1, 64]"),
    ],
)
def test_bad_model_shapes(args, needle):
    res = runner.invoke(app, ["models", "-m", "cifar_cnn", *args])
    assert_one_clear_line(res, needle, REPO / "no-outputs")
