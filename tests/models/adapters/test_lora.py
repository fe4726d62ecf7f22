"""LoRA (models/adapters/lora.py, through PEFT) on the three backbone families it targets: a
tiny random BERT (transformers BertConfig), a tiny timm ViT and EfficientNet-Lite0 (1x1 convs
with TensorFlow-style padding). No downloads."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.engine import FederationConfig, Simulation
from fedcore.schedules import LRSchedule
from models import get_model
from models.adapters import adapt, get_adapter
from models.adapters.lora import lora_delta, lora_layers
from tasks.training import modelfile
from tests.helpers import H
from tests.models.adapters.support import BUILDERS, build, data, effnet, inputs, one_step_changes

R = 8  # the default rank
REPO = Path(__file__).resolve().parents[3]
EFF_BN_LAYERS = 49  # EfficientNet-Lite0's BatchNorm layers (stem, 48 in the blocks + head)


def adapted(kind: str, options: dict | None = None) -> nn.Module:
    """A picklable factory for the engine (module-level, like tests.helpers)."""
    return build(kind, "lora", options)


def _randomise_lora(model: nn.Module, seed: int = 0) -> None:
    """Non-zero B (and new A) so merge and round trips are tested on a real update."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_A." in n or ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("kind", BUILDERS)
def test_lora_starts_equal_to_the_base(kind):
    base, model = build(kind, None).eval(), build(kind).eval()
    x = inputs(kind)
    with torch.no_grad():
        assert torch.equal(base(x), model(x))  # B is zero-initialised
    layers = lora_layers(model)
    assert layers and all(
        torch.count_nonzero(m.lora_B["default"].weight) == 0 for m in layers.values()
    )


@pytest.mark.parametrize("kind", BUILDERS)
def test_training_step_changes_only_the_payload(kind):
    m = get_adapter("lora")
    model = build(kind)
    keys = set(m.payload_keys(model))
    assert all(
        ".lora_A." in k
        or ".lora_B." in k
        or "_bn" in k
        or k.startswith(("classifier.", "head.", "_fc."))
        for k in keys
    )
    changed = one_step_changes(model, m, kind)
    assert changed <= keys  # the base (attention, FFN, convs, LayerNorm) is bit-identical
    assert m.trainable_keys(model) <= changed  # A and B both move (B from zero, A by decay)


@pytest.mark.parametrize("kind", BUILDERS)
def test_payload_round_trips(kind):
    m = get_adapter("lora")
    src = build(kind)
    _randomise_lora(src)
    wire = payload.encode(m.payload(src))
    dst = build(kind)
    m.load_payload(dst, payload.decode(wire))
    x = inputs(kind)
    with torch.no_grad():
        assert torch.equal(src.eval()(x), dst.eval()(x))


@pytest.mark.parametrize("kind", BUILDERS)
def test_merged_outputs_equal_adapted_outputs(kind):
    m = get_adapter("lora")
    model = build(kind)
    _randomise_lora(model)
    merged = m.merge(model)
    base = build(kind, None)
    assert merged is not None and type(merged) is type(base)
    assert not lora_layers(merged) and "peft_config" not in vars(merged)
    assert list(merged.state_dict()) == list(base.state_dict())  # the backbone's own keys
    assert all(p.requires_grad for p in merged.parameters())
    x = inputs(kind)
    with torch.no_grad():
        out, plain = model.eval()(x), merged.eval()(x)
        assert (out - base.eval()(x)).abs().max() > 1e-3  # the update is not negligible
        assert (out - plain).abs().max().item() <= 1e-5
    # The merged weight is W + (alpha / r) B A: lora_delta gives the update.
    delta = lora_delta(model)
    for name, d in delta.items():
        key = name.replace(".weight", ".base_layer.weight")
        w = model.state_dict()[key]
        assert torch.allclose(merged.state_dict()[name], w + d, atol=1e-6)


def test_payload_sizes_equal_hand_computed():
    # BERT and ViT: query and value of 2 blocks, A (8, 16) + B (16, 8) each; head 16*3 + 3.
    for kind in ("bert", "vit"):
        m = get_adapter("lora")
        sent = m.payload(build(kind))
        assert len(sent) == 2 * 2 * 2 + 2
        assert payload.tensor_nbytes(sent) == (2 * 2 * (R * H + H * R) + H * 3 + 3) * 4
        counts = m.counts(build(kind))
        assert counts.payload_bytes == len(payload.encode(sent))
        assert counts.trainable_params == 2 * 2 * 2 * R * H + 51
    # EfficientNet-Lite0 (models/efficientnet.py): 22,784 LoRA parameters per unit of rank on
    # the 32 pointwise convs; BatchNorm 42,016 (+ running mean/var, int64 counters); head.
    model = build("efficientnet")
    m = get_adapter("lora")
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert lora == 22_784 * R and len(lora_layers(model)) == 32
    head = 1280 * 3 + 3
    assert m.counts(model).trainable_params == 22_784 * R + 42_016 + head
    sent = m.payload(model)
    assert payload.tensor_nbytes(sent) == (22_784 * R + 2 * 42_016 + head) * 4 + 8 * EFF_BN_LAYERS
    # r = 4 with BatchNorm and head is 4.3% of the 10-class model (3,383,818 parameters).
    small = adapt(effnet(num_classes=10), "lora", options={"r": 4})
    assert m.counts(small).trainable_params == 145_962


def test_vit_b_lora_payload_is_under_2_percent_of_the_model():
    """Seed 003: LoRA on ViT-B 1.12 MB vs 330.96 MB. Two of 12 blocks here (speed); the payload
    grows by 2 * r * 2 * 768 per block, the model by 7,087,872."""
    vit = get_model("vit_base", num_classes=100, input_size=32, depth=2)
    lora = adapt(get_model("vit_base", num_classes=100, input_size=32, depth=2), "lora")
    per_block = 2 * (R * 768 + 768 * R)
    n = get_adapter("lora").counts(lora)
    assert n.trainable_params == 2 * per_block + 768 * 100 + 100
    full_12 = sum(p.numel() for p in vit.parameters()) + 10 * 7_087_872
    assert (12 * per_block + 76_900) / full_12 < 0.02  # 371,812 of 86,170,468 (0.43%)


def test_engine_round_trains_only_the_payload_and_counts_it():
    """One FedAvg round through the engine's functional clients, on BERT and EfficientNet."""
    for kind in ("bert", "efficientnet"):
        m = get_adapter("lora")
        model = adapted(kind)
        keys = m.payload_keys(model)
        sim = Simulation(
            model_fn=functools.partial(adapted, kind),
            workers=0,
            algorithm=build_algorithm("fedavg"),
            train=data(kind, 64),
            test=data(kind, 32, seed=1),
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
            assert torch.equal(v, start[k]) or k in keys, k  # the base never moves
        assert any(not torch.equal(sim.global_state[k], start[k]) for k in keys if ".lora_B." in k)
        wire = len(payload.encode(m.payload(model)))
        assert history.rounds[0].upload_bytes == history.rounds[0].download_bytes == 2 * wire


def test_vit_cls_plumbing_survives_lora():
    from models.text import cls_states

    model = build("vit")
    states = cls_states(model, inputs("vit", 4))
    assert states.shape == (4, 2, H)


@pytest.mark.slow
def test_lora_cell_registers_the_merged_efficientnet(tmp_path, monkeypatch):
    """The training cell on FashionMNIST (EfficientNet-Lite0 at 16x16, ImageNet base): traffic
    is the LoRA payload, and the registered champion is the merged plain backbone whose
    outputs equal the adapted model's."""
    import mlflow.pytorch

    from models.adapters import adapted_model
    from tasks.config import load_params
    from tasks.data.backbone import model_input
    from tasks.data.experiment import load_experiment_data
    from tasks.data.partitioning import build_partition, write_partition
    from tasks.training.cell import cell_of
    from tasks.training.train import run_cell

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    p = load_params(
        REPO / "params.yaml",
        [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            f"data.root={REPO / 'data/raw'}",
            "data.train_subset=200",
            "data.test_subset=100",
            "tracking.register=always",  # a test subset: registered on request
            "partition.num_clients=4",
            "partition.dirichlet_classwise.min_size=5",
            "validation.min_shard_size=5",
            "federation.rounds=1",
            "model.name=efficientnet_lite0",
            "model.base=imagenet",
            "model.input_size=16",
            "grid.adapter_options.lora.r=4",
            "runtime.workers=0",
            "storage.bucket=null",
        ],
    )
    data = load_experiment_data(p)
    write_partition(p, data, build_partition(p, data), tmp_path / "partition")
    cell = cell_of(p, data, "fedavg", "lora")
    record = run_cell(cell, tmp_path / "partition", tmp_path / "cell")
    kw = {"num_classes": 10, "in_channels": 1, "input_size": 16, "pretrained": True}
    adapted = adapted_model("efficientnet_lite0", "lora", {"r": 4}, **kw)
    wire = len(payload.encode(get_adapter("lora").payload(adapted)))
    assert record["payload_bytes"] == wire and record["trainable_params"] == 145_962
    assert record["upload_bytes_per_round"] == 4 * wire
    loaded = mlflow.pytorch.load_model(f"models:/{record['registered_model']}@champion")
    assert not any("lora" in k or "base_layer" in k for k in loaded.state_dict())
    adapted = modelfile.load_cell_model(p, data, "lora", tmp_path / "cell")  # base + trained part
    test = data.image_data("test", model_input(p, data.train.info))
    idx = torch.arange(4)
    x, _ = test.batch(idx)
    stored = test.images.index_select(0, idx).float() / 255.0
    with torch.no_grad():
        assert torch.allclose(loaded(stored), adapted.eval()(x), atol=1e-5)


def test_lora_on_resnet26_targets_its_dense_convs_and_merges():
    """ResNet26 has ``blocks`` but no CLS plumbing: a CNN, LoRA on its 3x3 convs (no 1x1)."""
    torch.manual_seed(0)
    model = adapt(get_model("resnet26", num_classes=10, width=0.125), "lora")
    layers = lora_layers(model)
    convs = [n for n, m in get_model("resnet26", num_classes=10, width=0.125).named_modules()]
    assert len(layers) == 25 and set(layers) <= set(convs)
    _randomise_lora(model)
    merged = get_adapter("lora").merge(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model.eval()(x) - merged.eval()(x)).abs().max().item() <= 1e-5
