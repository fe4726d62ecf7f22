"""The cohort engine against the sequential reference: every algorithm x adapter method.

In float64 on tiny models the two engines must agree to 1e-9 (global model, every client's
steps, samples, loss and upload/download bytes, accuracy), with ragged shards (5 to 150
samples: short last batches, clients stopping early), Gaussian feature noise, momentum and
weight decay. The cases that run by default cover every algorithm (with ``full``) and every
adapter method (with FedAvg) plus the hooks that interact (FedProx/FedIR objectives under an
adapter, early exits in every mode, AdamW, max_steps, text batches); the whole cross product
is marked slow and runs in CI.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import ALGORITHMS, build_algorithm
from fedcore.client import LocalConfig, Objective, cross_entropy
from fedcore.cohort import CohortClient, CohortTrainer, shared_objective
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.schedules import LRSchedule
from models.adapters import ADAPTER_METHODS
from tests.fedcore.cohort.support import SHARDS, Model, assert_same, images, simulate
from tests.helpers import toy_data


def _grid():
    """Every algorithm x every adapter method it runs with; a default subset, the rest slow."""
    fast = {(a, "full") for a in ALGORITHMS} | {("fedavg", m) for m in ADAPTER_METHODS}
    fast |= {("fedprox", "lora"), ("fedir", "lw_linear"), ("fednova", "residual")}
    fast |= {("scaffold", "lora")}  # control variates over an adapter's parameters
    cases = []
    for algorithm, cls in sorted(ALGORITHMS.items()):
        for adapter in sorted(ADAPTER_METHODS):
            if cls.whole_model_only and adapter != "full":
                continue
            marks = () if (algorithm, adapter) in fast else (pytest.mark.slow,)
            cases.append(pytest.param(algorithm, adapter, marks=marks, id=f"{algorithm}-{adapter}"))
    return cases


@pytest.mark.parametrize(("algorithm", "adapter"), _grid())
def test_cohort_equals_sequential(algorithm, adapter):
    assert_same(simulate("sequential", algorithm, adapter), simulate("cohort", algorithm, adapter))


@pytest.mark.parametrize(
    ("algorithm", "adapter"),
    [("fedavg", "full"), ("fednova", "full"), ("fedadam", "full"), ("fednilo", "full"),
     ("fedprox", "lora"), ("fedavg", "residual"), ("scaffold", "full")],
)  # fmt: skip
def test_cohort_equals_sequential_with_batches_gathered_per_group(algorithm, adapter):
    """Without feature noise a step's batches come from one gather for the whole group (the
    round's indices sent to the device once); with noise (the cases above), client by client."""
    assert_same(
        simulate("sequential", algorithm, adapter, noise=False),
        simulate("cohort", algorithm, adapter, noise=False),
    )


@pytest.mark.parametrize(
    ("adapter", "options"),
    [
        ("lw_linear", {"exits": "anytime"}),
        ("lw_mlp", {"exits": "multitier", "tiers": [0, 1]}),
        ("accumulator", {"exits": "anytime"}),
    ],
)
def test_early_exits_group_clients_by_exit(adapter, options):
    """Anytime: a different exit per client and step; multi-tier: per client."""
    assert_same(
        simulate("sequential", "fedavg", adapter, options=options),
        simulate("cohort", "fedavg", adapter, options=options),
    )


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_adamw_and_max_steps(adapter):
    # tiny_adaptable has no parameter whose gradient is pure rounding noise (a conv bias
    # before BatchNorm), which AdamW's normalisation would blow up to ~1e-8 differences.
    kw = {"optimizer": "adamw", "max_steps": 5}
    assert_same(
        simulate("sequential", "fedavg", adapter, **kw), simulate("cohort", "fedavg", adapter, **kw)
    )


def test_text_batches_of_different_widths():
    """Token batches are cut to their longest text: clients are grouped by batch shape."""
    from fedcore.text import TextData

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 16, (400,), generator=g)
    tokens = torch.randint(1, 40, (400, 16), generator=g)
    tokens[torch.arange(16).expand(400, 16) >= lengths[:, None]] = 0
    labels = (tokens[:, 0] > 20).long()
    train = TextData(tokens, labels, pad_id=0)
    test = TextData(tokens[:100], labels[:100], pad_id=0)
    kw = {"kind": "bert", "data": train, "test": test, "noise": False}
    for algorithm, adapter in [("fedavg", "lora"), ("fedir", "lw_linear")]:
        assert_same(
            simulate("sequential", algorithm, adapter, **kw),
            simulate("cohort", algorithm, adapter, **kw),
        )


def test_cohort_split_by_size_and_repeated_runs_are_identical():
    whole = simulate("cohort", "fedprox", "full")
    split = simulate("cohort", "fedprox", "full", cohort_size=2)
    again = simulate("cohort", "fedprox", "full")
    assert_same(whole, split)
    for k, v in whole[0].items():
        assert torch.equal(v, again[0][k]), k


def test_upload_bytes_are_the_real_encoding():
    """The cohort's upload bytes are len(encode(upload)) of each client's own tensors (a view
    of the stacked cohort would serialise every client's)."""
    model = Model("full")()
    data = images(400, 0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = CohortTrainer(model)
    clients = [CohortClient(c, np.arange(10 * c, 10 * c + 10), seed=c) for c in range(3)]
    fn, ctxs = shared_objective("fedavg", [cross_entropy] * 3)
    results = trainer.train(
        state, data, clients, lr=0.1, cfg=LocalConfig(batch_size=4), fn=fn, ctxs=ctxs
    ).result
    sequential = simulate("sequential", "fedavg", "full", rounds=1)[2]
    cohort = simulate("cohort", "fedavg", "full", rounds=1)[2]
    assert [r.upload_bytes for r in cohort] == [r.upload_bytes for r in sequential]
    one = {k: v.clone() for k, v in results(0).state.items()}
    assert len(payload.encode(one)) == sequential[0].upload_bytes


def test_bad_engine_and_unbatchable_objective_are_one_line():
    with pytest.raises(ConfigError, match="runtime.engine must be one of cohort, sequential"):
        simulate("vectorised", "fedavg")
    per_client = [lambda logits, y, p: nn.functional.cross_entropy(logits, y) for _ in range(2)]
    with pytest.raises(ConfigError, match="cannot batch myalgo.*Objective"):
        shared_objective("myalgo", per_client)
    objs = [Objective(lambda *a: a[0].sum(), {"w": torch.ones(2)}), Objective(lambda *a: 0, {})]
    with pytest.raises(ConfigError, match="different tensors per client"):
        shared_objective("myalgo", objs)


def test_a_cohort_that_cannot_fit_stops_before_training(monkeypatch):
    from fedcore.cohort import trainer

    monkeypatch.setattr(trainer, "available_memory", lambda device: 1000)
    with pytest.raises(ConfigError, match="one client needs about .* MiB"):
        simulate("cohort", "fedavg", "full", rounds=1)


@pytest.mark.parametrize(
    ("adapter", "kind"), [("head", "cnn"), ("head", "vit"), ("lw_linear", "vit")]
)
def test_cached_frozen_features_equal_recomputed_and_sequential(adapter, kind, monkeypatch):
    """head: everything below the classifier is frozen and the input is noise-free, so its
    output per sample is computed once (FeatureCache). Cached, recomputed (cache too large for
    its memory share) and sequential training agree."""
    from fedcore.cohort import features

    kw = {"kind": kind, "noise": False, "rounds": 3}
    trainers: list = []
    original = features.FeatureCaches.features

    def spy(self, *a, **k):
        out = original(self, *a, **k)
        trainers.append(out)
        return out

    monkeypatch.setattr(features.FeatureCaches, "features", spy)
    cached = simulate("cohort", "fedprox", adapter, **kw)
    assert any(c is not None for c in trainers) == (adapter == "head")
    monkeypatch.setattr(features, "FEATURE_CACHE_SHARE", 0.0)
    trainers.clear()
    recomputed = simulate("cohort", "fedprox", adapter, **kw)
    assert all(c is None for c in trainers)
    assert_same(simulate("sequential", "fedprox", adapter, **kw), cached)
    assert_same(recomputed, cached)


def test_auto_engine_follows_the_measurements():
    """auto: cohort where the frozen part's output is cached (head; lw_linear's CLS history);
    sequential for whole-model training, LoRA, the Accumulator and Gaussian noise."""
    from fedcore.cohort import resolve_engine
    from models.adapters import get_adapter

    def keys(adapter, kind="cnn"):
        model = Model(adapter, kind=kind)()
        return model, get_adapter(adapter).trainable_keys(model)

    assert resolve_engine("auto", "cpu", *keys("head")) == "cohort"
    assert resolve_engine("auto", "cpu", *keys("head"), noise_var=[0.0, 0.1]) == "sequential"
    assert resolve_engine("auto", "cpu", Model("full")(), None) == "sequential"
    assert resolve_engine("auto", "cpu", *keys("lora")) == "sequential"
    assert resolve_engine("auto", "cpu", *keys("lw_linear", "vit")) == "cohort"
    assert resolve_engine("auto", "cpu", *keys("accumulator", "vit")) == "sequential"
    assert resolve_engine("sequential", "cpu", *keys("head")) == "sequential"
    assert resolve_engine("cohort", "cpu", Model("full")(), None) == "cohort"
    with pytest.raises(ConfigError, match="runtime.engine must be one of auto, cohort"):
        resolve_engine("fast", "cpu")


def test_random_layers_are_refused_before_training():
    from fedcore.cohort import resolve_engine

    def dropout_model() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout(0.5), nn.Flatten(), nn.Linear(200, 2))

    with pytest.raises(ConfigError, match=r"cohort cannot batch random layers \(1: dropout"):
        Simulation(
            model_fn=dropout_model,
            algorithm=build_algorithm("fedavg"),
            train=toy_data(),
            test=toy_data(50),
            shards=[np.arange(10)],
            local=LocalConfig(),
            lr_schedule=LRSchedule(lr=0.1),
            federation=FederationConfig(rounds=1, clients_per_round=1),
            engine="cohort",
        )
    assert resolve_engine("auto", "cpu", dropout_model(), frozenset({"3.weight"})) == "sequential"


@pytest.mark.parametrize(
    ("adapter", "options", "cached"),
    [
        ("lw_linear", {"exits": "anytime"}, True),
        ("lw_mlp", {"exits": "multitier", "tiers": [0, 1], "exit": 0}, True),
        ("accumulator", {"exits": "anytime"}, False),  # later blocks read its token
    ],
)
def test_cached_cls_history_for_early_exits(adapter, options, cached, monkeypatch):
    """lw_linear/lw_mlp on a frozen encoder: the CLS state after every block is computed once
    per sample (training and test sets); cached, recomputed and sequential runs agree, the
    accuracy at every exit included."""
    from fedcore.cohort import features

    kw = {"options": options, "noise": False, "rounds": 3}
    built: list = []
    original = features.FeatureCaches.history

    def spy(self, *a, **k):
        out = original(self, *a, **k)
        built.append(out)
        return out

    monkeypatch.setattr(features.FeatureCaches, "history", spy)
    fast = simulate("cohort", "fedir", adapter, **kw)
    assert any(c is not None for c in built) == cached
    monkeypatch.setattr(features, "FEATURE_CACHE_SHARE", 0.0)
    built.clear()
    slow = simulate("cohort", "fedir", adapter, **kw)
    assert all(c is None for c in built)
    reference = simulate("sequential", "fedir", adapter, **kw)
    assert_same(reference, fast)
    assert_same(slow, fast)
    exits = [k for k in fast[1].rounds[-1].extra if k.startswith("test_accuracy_exit_")]
    assert len(exits) == 2


def test_mean_losses_equal_each_clients_own_mean():
    """The cohort reads its losses back once and takes each client's mean row-wise: equal,
    bit for bit, to torch.mean of the client's own losses (what train_locally reports)."""
    from fedcore.cohort.layout import mean_losses

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        per_client = [
            (torch.rand(k, generator=g, dtype=torch.float64) * 4).to(dtype).tolist()
            for k in [5, 5, 1, 0, 37, 5, 200, 37]
        ]
        got = mean_losses(per_client, dtype)
        for v, m in zip(per_client, got, strict=True):
            if v:
                assert m == torch.tensor(v, dtype=dtype).mean().item()
            else:
                assert m != m  # NaN: no step


def test_a_cohort_round_reads_back_from_the_device_at_most_five_times():
    """Issue 31's budget, counted on the CPU (a read of a scalar is a device wait on CUDA):
    the second of two rounds adds at most 5 aten::_local_scalar_dense, whatever the clients."""
    from torch.profiler import ProfilerActivity, profile

    def reads(rounds: int) -> int:
        perm = np.random.default_rng(0).permutation(400)
        sim = Simulation(
            model_fn=Model("full"),
            algorithm=build_algorithm("fednova"),
            train=images(400, 0),
            test=images(100, 1),
            shards=[perm[a:b] for a, b in SHARDS],  # ragged: clients stop at other steps
            local=LocalConfig(batch_size=16, momentum=0.9, local_epochs=2),
            lr_schedule=LRSchedule(lr=0.05),
            federation=FederationConfig(rounds=rounds, clients_per_round=4, seed=1, eval_every=0),
            workers=0,
            engine="cohort",
        )
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sim.run()
        return sum(e.name == "aten::_local_scalar_dense" for e in prof.events())

    assert reads(2) - reads(1) <= 5
