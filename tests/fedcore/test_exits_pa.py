"""The early-exit methods with parallel adapters (accumulator_pa, lw_linear_pa, lw_mlp_pa; seed
001 §5 "+PA"; models/adapters/exits_pa.py) on a tiny random BERT and a tiny timm ViT: the payload
is the exit modules plus the adapters (hand-counted, and seed 001 Table 5's 0.60M on DeiT-S), a
step trains only them, at injection the logits are the plain exit method's, two federated
rounds on both engines, personalization. No downloads."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig
from fedcore.cohort import resolve_engine
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.personalize import PersonalizeConfig, personalize
from fedcore.protocols import exit_heads
from fedcore.schedules import LRSchedule
from models import get_model
from models.adapters import adapt, get_adapter
from models.adapters.exits_pa import (
    PA_BOTTLENECK,
    AccumulatorPAOptions,
    LayerwiseMLPPAOptions,
    LayerwisePAOptions,
)
from tests.fedcore.support import assert_exit_accuracies
from tests.helpers import H, tiny_bert, tiny_vit, toy_data
from tests.models.adapters.support import inputs, one_step_changes

PLAIN = {"accumulator_pa": "accumulator", "lw_linear_pa": "lw_linear", "lw_mlp_pa": "lw_mlp"}
KINDS = {"bert": tiny_bert, "vit": tiny_vit}
CASES = [(m, k) for m in PLAIN for k in KINDS]
DEPTH, CLASSES, M = 2, 3, 4  # tiny models: 2 blocks of width H = 16, 3 classes; bottleneck 4


def build(kind: str, method: str, options: dict | None = None) -> nn.Module:
    torch.manual_seed(0)
    return adapt(KINDS[kind](CLASSES), method, kind, options)


def pa_params(hidden: int, m: int) -> int:
    return 2 * hidden * m + m + hidden  # down (H -> m, bias) + up (m -> H, bias)


# Hand-computed exit modules of the tiny models (H = 16, 2 blocks, 3 classes):
# lw_linear: 2 x (16 x 3 + 3); lw_mlp (width 4H = 64): 2 x (16 x 64 + 64 + 64 x 3 + 3);
# accumulator: client
# token 16, layer embeddings 3 x 16, one transformer layer (1 head, FFN 64: qkv 3 x (16 x 16 + 16),
# out 16 x 16 + 16, FFN 16 x 64 + 64 + 64 x 16 + 16, two LayerNorms 2 x 32) and the MLP head
# 16 x 16 + 16 + 16 x 3 + 3.
EXITS = {
    "lw_linear": 2 * 51,
    "lw_mlp": 2 * 1283,
    "accumulator": 16 + 48 + (816 + 272 + 1088 + 1040 + 64) + 323,
}


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_payload_is_the_exits_plus_the_adapters(method, kind):
    options = {"bottleneck": M}
    m, plain = get_adapter(method, options), get_adapter(PLAIN[method])
    model, reference = build(kind, method, options), build(kind, PLAIN[method])
    adapters = {k for k in m.payload_keys(model) if ".adapter." in k}
    assert len(adapters) == 4 * DEPTH  # down and up, weight and bias, per block
    assert set(m.payload_keys(model)) == set(plain.payload_keys(reference)) | adapters
    assert m.trainable_keys(model) == set(m.payload_keys(model))
    counts = m.counts(model)
    want = EXITS[PLAIN[method]] + DEPTH * pa_params(H, M)
    assert plain.counts(reference).payload_numel == EXITS[PLAIN[method]]
    assert counts.trainable_params == counts.payload_numel == want
    assert counts.payload_bytes == len(payload.encode(m.payload(model)))
    assert m.merge(model) is None and not m.mergeable


def test_seed_001_pa_size_on_deit_small():
    """Seed 001 Table 5: PA 0.60M on DeiT-S (12 blocks, H 384) = 12 x (2 x 384 x 64 + 64 + 384);
    Table 6: L.W. Linear 0.46M -> +Adapter 1.06M (CIFAR-100). One block, times 12."""
    model = get_model("deit_small", num_classes=100, in_channels=3, input_size=32, depth=1)
    model = adapt(model, "lw_linear_pa", "deit_small")
    m = get_adapter("lw_linear_pa")
    per_block = sum(p.numel() for n, p in model.named_parameters() if ".adapter." in n)
    assert PA_BOTTLENECK == 64 and per_block == pa_params(384, 64) == 49_600
    assert round(12 * per_block / 1e6, 2) == 0.60
    assert m.counts(model).payload_numel == per_block + 384 * 100 + 100  # one block's exit
    assert round(12 * m.counts(model).payload_numel / 1e6, 2) == 1.06


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_starts_with_the_plain_exit_methods_logits(method, kind):
    """The adapters' up-projections start at zero: every exit equals the plain method's (the
    exit modules are built first, from the same random stream)."""
    options = {"exits": "anytime", "bottleneck": M}
    model, plain = build(kind, method, options).eval(), build(kind, PLAIN[method]).eval()
    x = inputs(kind)
    with torch.no_grad():
        model.exit_plan.output = plain.exit_plan.output = "all"
        every = model(x)
        assert every.shape == (DEPTH, len(x), CLASSES)
        assert torch.equal(every, plain(x))
        g = torch.Generator().manual_seed(0)
        for n, p in model.named_parameters():
            if ".adapter.up." in n:  # random: a constant shift would vanish in BERT's LayerNorm
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        assert not torch.allclose(model(x)[-1], every[-1])  # the adapters are in the path


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_training_step_changes_only_the_payload(method, kind):
    options = {"exits": "anytime", "bottleneck": M}
    m = get_adapter(method, options)
    model = build(kind, method, options)
    keys = set(m.payload_keys(model))
    model.exit_plan.begin_client(0, 7)
    changed = one_step_changes(model, m, kind, batch_size=8)
    assert changed <= keys  # attention, FFN, LayerNorms, embeddings, classifier: untouched
    assert any(".adapter.up." in k for k in changed)  # the adapters train ...
    assert any(".adapter." not in k for k in changed)  # ... with the exits


def test_not_cached_and_auto_runs_them_sequentially():
    """The CLS states depend on the adapters: no exit heads to cache (fedcore.protocols)."""
    for method in PLAIN:
        model = build("vit", method)
        assert exit_heads(model) is None
        trainable = get_adapter(method).trainable_keys(model)
        assert resolve_engine("auto", "cpu", model, trainable) == "sequential"
    assert exit_heads(build("vit", "lw_linear")) is not None  # the plain heads are cached


def simulate(method: str, options: dict):
    m = get_adapter(method, options)
    model = build("vit", method, options)
    sim = Simulation(
        model_fn=functools.partial(build, "vit", method, options),
        workers=0,
        algorithm=build_algorithm("fedavg"),
        train=toy_data(120),
        test=toy_data(40, seed=1),
        shards=[np.arange(0, 40), np.arange(40, 80), np.arange(80, 120)],
        local=LocalConfig(batch_size=16, momentum=0.9),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=2, clients_per_round=3),
        engine="sequential",  # the cohort engine: tests/fedcore/cohort/test_cohort.py's registry grid
        payload_keys=m.payload_keys(model),
        trainable=m.trainable_keys(model),
    )
    start = {k: v.clone() for k, v in sim.global_state.items()}
    return m, model, start, sim, sim.run()


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("accumulator_pa", {"exits": "multitier", "tiers": [0, 1]}),
        ("lw_linear_pa", {"exits": "anytime"}),
        ("lw_mlp_pa", {"exits": "last", "bottleneck": M}),
    ],
)
def test_two_federated_rounds(method, options):
    m, model, start, sim, history = simulate(method, options)
    keys = set(m.payload_keys(model))
    for k, v in sim.global_state.items():
        assert torch.equal(v, start[k]) or k in keys, k  # the frozen base never moves
    moved = {k for k in keys if not torch.equal(sim.global_state[k], start[k])}
    assert any(".adapter.up." in k for k in moved) and any(".adapter." not in k for k in moved)
    wire = len(payload.encode(m.payload(model)))
    assert [r.upload_bytes for r in history.rounds] == [3 * wire] * 2
    assert [r.download_bytes for r in history.rounds] == [3 * wire] * 2
    base = {k: v for k, v in start.items() if k not in keys}
    assert history.base_bytes == len(payload.encode(base))  # counted once per client, apart
    assert_exit_accuracies(model, sim, history.rounds[-1], toy_data(40, seed=1))


def test_personalization_scopes():
    """payload: exits and adapters tune; client_token: the Accumulator's token alone."""
    options = {"exits": "multitier", "tiers": [0, 1], "bottleneck": M}
    model = build("vit", "accumulator_pa", options)
    m = get_adapter("accumulator_pa", options)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    shards = [np.arange(0, 30), np.arange(30, 60)]
    tuned: dict[str, list] = {}
    for scope in ("payload", "client_token"):
        cfg = PersonalizeConfig(scope=scope, local=LocalConfig(batch_size=10), severities=(0, 3))
        results = personalize(
            model,
            state,
            toy_data(60),
            shards,
            m.trainable_keys(model),
            cfg,
            on_client=lambda _r, s, scope=scope: tuned.setdefault(scope, []).append(s),
        )
        assert [r.client for r in results] == [0, 1]
    for scope, states in tuned.items():
        for s in states:
            changed = {k for k in state if not torch.equal(state[k], s[k])}
            if scope == "client_token":
                assert changed == {"accumulator.client_token"}
            else:
                assert changed <= set(m.payload_keys(model))
                assert any(".adapter." in k for k in changed)


def test_options_are_the_exits_plus_the_adapters():
    assert get_adapter("lw_linear_pa").options == LayerwisePAOptions(bottleneck=64, scaling=4.0)
    mlp = get_adapter("lw_mlp_pa", {"mlp_ratio": 2})
    assert mlp.options == LayerwiseMLPPAOptions(mlp_ratio=2.0, bottleneck=64, scaling=4.0)
    acc = get_adapter("accumulator_pa", {"heads": 2, "scaling": 2, "exit": 0})
    assert acc.options == AccumulatorPAOptions(heads=2, scaling=2.0, exit=0)
    with pytest.raises(ConfigError) as err:
        get_adapter("lw_linear_pa", {"heads": 2})
    assert str(err.value) == (
        "unknown key 'grid.adapter_options.lw_linear_pa.heads'; "
        "allowed: exits, tiers, exit, bottleneck, scaling"
    )
    with pytest.raises(ConfigError, match=r"^adapter 'accumulator_pa': exit 2 is beyond"):
        build("bert", "accumulator_pa", {"exit": 2})
    with pytest.raises(ConfigError, match=r"^adapter 'accumulator_pa': heads 5 must divide"):
        build("vit", "accumulator_pa", {"heads": 5})
    with pytest.raises(ConfigError, match="bottleneck: must be greater than or equal to 1"):
        get_adapter("lw_mlp_pa", {"bottleneck": 0})


def test_not_applicable_to_cnns():
    from tests.helpers import TinyAdaptable

    for method in PLAIN:
        with pytest.raises(ConfigError, match="not a transformer with CLS plumbing"):
            adapt(TinyAdaptable(), method)


@pytest.mark.parametrize(("method", "table"), [("lw_mlp", 8.94), ("lw_mlp_pa", 9.54)])
def test_seed_001_mlp_exit_size_on_deit_small(method, table):
    """Seed 001 Table 5: Layer-wise MLP 8.95M on DeiT-S with 100 classes, Table 6: +Adapter
    9.55M: 12 x (384 x 1536 + 1536 + 1536 x 100 + 100) = 8,940,720, an MLP of width 4H (the
    default ``mlp_ratio``), plus the 0.60M of PA. One block, times 12. The seed rounds up."""
    model = get_model("deit_small", num_classes=100, in_channels=3, input_size=32, depth=1)
    model = adapt(model, method, "deit_small")
    numel = get_adapter(method).counts(model).payload_numel
    exit_head = 384 * 1536 + 1536 + 1536 * 100 + 100
    assert numel == exit_head + (pa_params(384, 64) if method.endswith("_pa") else 0)
    assert round(12 * numel / 1e6, 2) == table
    narrow = adapt(
        get_model("deit_small", num_classes=100, in_channels=3, input_size=32, depth=1),
        method,
        "deit_small",
        {"mlp_ratio": 1.0},
    )
    assert get_adapter(method, {"mlp_ratio": 1.0}).counts(narrow).payload_numel == numel - (
        exit_head - (384 * 384 + 384 + 384 * 100 + 100)
    )
