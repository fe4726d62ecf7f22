"""Bottleneck adapters (models/adapters/bottleneck.py: houlsby, pfeiffer, parallel) on a tiny
random BERT and a tiny timm ViT, plus the seed-003 sizes on a ViT-B-shaped block. No downloads."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.schedules import LRSchedule
from models import get_model
from models.adapters import adapt, get_adapter
from models.adapters.bottleneck import SequentialAdapter
from tests.helpers import H, tiny_bert, tiny_vit
from tests.models.adapters.support import data, inputs, one_step_changes

METHODS = ("houlsby", "pfeiffer", "parallel")
KINDS = {"bert": tiny_bert, "vit": tiny_vit}
CASES = [(m, k) for m in METHODS for k in KINDS]


def build(kind: str, method: str | None, options: dict | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = KINDS[kind]()
    return model if method is None else adapt(model, method, kind, options)


def randomise_adapters(model: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".adapter." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_starts_equal_to_the_base(method, kind):
    base, model = build(kind, None).eval(), build(kind, method).eval()
    x = inputs(kind)
    with torch.no_grad():
        assert torch.equal(base(x), model(x))  # up-projections start at zero


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_training_step_changes_only_the_payload(method, kind):
    m = get_adapter(method)
    model = build(kind, method)
    keys = set(m.payload_keys(model))
    assert keys and all(".adapter." in k or k.startswith(("classifier.", "head.")) for k in keys)
    changed = one_step_changes(model, m, kind)
    assert changed <= keys  # attention, FFN, LayerNorms, embeddings: bit-identical
    assert any(".adapter.up." in k for k in changed)  # the adapters do train


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_payload_round_trips_and_changes_the_output(method, kind):
    m = get_adapter(method)
    src = build(kind, method)
    randomise_adapters(src)
    dst = build(kind, method)
    m.load_payload(dst, payload.decode(payload.encode(m.payload(src))))
    x = inputs(kind)
    with torch.no_grad():
        assert torch.equal(src.eval()(x), dst.eval()(x))
        assert not torch.allclose(dst(x), build(kind, None).eval()(x))  # adapters are in the path


def bottleneck_params(hidden: int, m: int) -> int:
    return hidden * m + m + m * hidden + hidden  # down (weight, bias) + up (weight, bias)


@pytest.mark.parametrize("kind", KINDS)
def test_payload_sizes_equal_hand_computed(kind):
    blocks, head = 2, H * 3 + 3  # tiny models: 2 blocks, 3 classes; reduction 16 -> m = 1
    per = bottleneck_params(H, 1)
    want = {"houlsby": 2 * blocks * per + head, "pfeiffer": blocks * per + head}
    want["parallel"] = want["pfeiffer"]
    for method, numel in want.items():
        m = get_adapter(method)
        model = build(kind, method)
        counts = m.counts(model)
        assert counts.trainable_params == counts.payload_numel == numel, method
        assert counts.payload_bytes == len(payload.encode(m.payload(model)))
    wide = get_adapter("houlsby", {"reduction_factor": 4})
    model = adapt(KINDS[kind](), "houlsby", kind, {"reduction_factor": 4})
    assert wide.counts(model).payload_numel == 2 * blocks * bottleneck_params(H, 4) + head


def test_vit_b_sizes_match_seed_003_table_12():
    """ViT-B (width 768, 12 blocks), reduction factor 16: Pfeiffer's adapters are 3.41 MiB,
    Houlsby's 6.82 MiB (seed 003 Table 12: 3.41 MB, 6.82 MB). One block, times 12."""
    per_block = {}
    for method in ("pfeiffer", "houlsby"):
        model = adapt(
            get_model("vit_base", num_classes=100, in_channels=3, input_size=32, depth=1),
            method,
            "vit_base",
        )
        per_block[method] = sum(
            p.numel() for n, p in model.named_parameters() if p.requires_grad and ".adapter." in n
        )
    assert per_block["pfeiffer"] == bottleneck_params(768, 48) == 74_544
    assert round(12 * per_block["pfeiffer"] * 4 / 2**20, 2) == 3.41
    assert round(12 * per_block["houlsby"] * 4 / 2**20, 2) == 6.82


def test_engine_round_trains_only_the_payload_and_counts_it():
    for method in METHODS:
        m = get_adapter(method)
        model = build("bert", method)
        keys = m.payload_keys(model)
        sim = Simulation(
            model_fn=functools.partial(build, "bert", method),
            workers=0,
            algorithm=build_algorithm("fedavg"),
            train=data("bert", 64),
            test=data("bert", 32, seed=1),
            shards=[np.arange(0, 32), np.arange(32, 64)],
            local=LocalConfig(batch_size=16, momentum=0.9),
            lr_schedule=LRSchedule(lr=0.05),
            federation=FederationConfig(rounds=1, clients_per_round=2),
            payload_keys=keys,
            trainable=m.trainable_keys(model),
        )
        start = {k: v.clone() for k, v in sim.global_state.items()}
        history = sim.run()
        for k, v in sim.global_state.items():
            assert torch.equal(v, start[k]) or k in keys, k
        assert any(not torch.equal(sim.global_state[k], start[k]) for k in keys if ".up." in k)
        wire = len(payload.encode(m.payload(model)))
        assert history.rounds[0].upload_bytes == history.rounds[0].download_bytes == 2 * wire


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_pfeiffer_adapter_sits_after_the_ffn_output_only(kind):
    """Pfeiffer (AdapterFusion, seed 003 [15]): one adapter per block after the feed-forward
    output projection; nothing after the attention output (Houlsby has both)."""
    torch.manual_seed(0)
    model = adapt({"bert": tiny_bert, "vit": tiny_vit}[kind](), "pfeiffer", kind)
    sites = [n for n, m in model.named_modules() if isinstance(m, SequentialAdapter)]
    ffn_out = {"bert": "output.dense", "vit": "mlp.fc2"}[kind]
    prefix = {"bert": "bert.encoder.layer", "vit": "blocks"}[kind]
    assert sites == [f"{prefix}.{i}.{ffn_out}" for i in range(2)]
    for block in model.blocks:
        attn_out = {"bert": "attention.output.dense", "vit": "attn.proj"}[kind]
        assert isinstance(block.get_submodule(attn_out), nn.Linear)
    # the adapter reads the FFN output projection's output y and adds to it: y + A(y)
    site = model.get_submodule(sites[0])
    with torch.no_grad():
        for p in site.adapter.parameters():
            p.copy_(torch.randn(p.shape) * 0.1)
        x = torch.randn(3, site.base.in_features)
        y = site.base(x)
        assert torch.allclose(site(x), y + site.adapter(y))
        assert not torch.allclose(site(x), y)


def test_parallel_reads_the_ffn_input_and_scales():
    """He et al.: FFN(x) + s * adapter(x); doubling s doubles the adapter's contribution."""
    outs = []
    for s in (2.0, 4.0):
        model = build("vit", "parallel", {"scaling": s})
        randomise_adapters(model)
        ffn = model.blocks[0].mlp
        x = torch.randn(2, 5, H)
        with torch.no_grad():
            outs.append(ffn(x) - ffn.base(x))
    assert torch.allclose(outs[1], 2 * outs[0], atol=1e-6)


def test_not_mergeable_registers_the_adapted_model():
    for method in METHODS:
        assert get_adapter(method).merge(build("bert", method)) is None


def test_cnn_is_refused_in_one_line_naming_what_applies():
    model = get_model("cifar_cnn", num_classes=10, in_channels=1, input_size=28)
    with pytest.raises(ConfigError) as err:
        adapt(model, "houlsby", "cifar_cnn")
    msg = str(err.value)
    assert "\n" not in msg and "not a transformer encoder" in msg
    assert "methods that apply: " in msg and "houlsby" not in msg.split("apply: ")[1]


@pytest.mark.parametrize(
    ("method", "options", "needle"),
    [
        (
            "houlsby",
            {"reduction_factor": 0},
            "grid.adapter_options.houlsby.reduction_factor: must be greater than or equal to 1 "
            "(got 0)",
        ),
        (
            "houlsby",
            {"reduction_factor": "8"},
            "grid.adapter_options.houlsby.reduction_factor: must be a valid integer (got '8')",
        ),
        (
            "pfeiffer",
            {"reduction_factor": True},
            "grid.adapter_options.pfeiffer.reduction_factor: must be a valid integer (got True)",
        ),
        (
            "pfeiffer",
            {"rank": 4},
            "unknown key 'grid.adapter_options.pfeiffer.rank'; allowed: reduction_factor",
        ),
        (
            "houlsby",
            {"scaling": 2},
            "unknown key 'grid.adapter_options.houlsby.scaling'; allowed: reduction_factor",
        ),
        (
            "parallel",
            {"scaling": -1},
            "grid.adapter_options.parallel.scaling: must be greater than 0 (got -1)",
        ),
        (
            "parallel",
            {"scaling": float("inf")},
            "grid.adapter_options.parallel.scaling: must be a finite number (got inf)",
        ),
        (
            "parallel",
            {"size": 2},
            "unknown key 'grid.adapter_options.parallel.size'; allowed: reduction_factor, scaling",
        ),
    ],
)
def test_bad_options_are_one_line(method, options, needle):
    with pytest.raises(ConfigError, match=None) as err:
        get_adapter(method, options)
    assert str(err.value) == needle
