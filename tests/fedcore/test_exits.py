"""Early-exit methods (lw_linear, lw_mlp, accumulator; seed 001 §4-§5) on a tiny random BERT
and a tiny timm ViT: logits at every exit, frozen base, payload, anytime and multi-tier
training, per-exit evaluation in the engine, bad options in one line. No downloads."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from fedcore import payload
from fedcore.algorithms import build_algorithm
from fedcore.client import LocalConfig, train_locally
from fedcore.engine import FederationConfig, Simulation
from fedcore.errors import ConfigError
from fedcore.schedules import LRSchedule
from flows.cli import results_table
from models.adapters import adapt, get_adapter
from models.adapters.accumulator import AccumulatorOptions
from models.adapters.exits import ExitOptions, ExitPlan
from tasks.training.outputs import exit_accuracies
from tests.fedcore.support import DEPTH, assert_exit_accuracies
from tests.helpers import tiny_bert, tiny_vit, toy_data

EXIT_METHODS = ["accumulator", "lw_linear", "lw_mlp"]
BUILDERS = {"bert": tiny_bert, "vit": tiny_vit}


def build(kind: str, method: str, options: dict | None = None, num_classes: int = 3):
    torch.manual_seed(0)
    return adapt(BUILDERS[kind](num_classes), method, kind, options)


def inputs(kind: str, n: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if kind == "bert":
        return torch.randint(1, 40, (n, 10), generator=g)  # token ids, no padding
    return torch.randn(n, 1, 12, 12, generator=g)


@pytest.mark.parametrize("kind", BUILDERS)
@pytest.mark.parametrize("method", EXIT_METHODS)
def test_logits_at_every_exit_and_frozen_base(kind, method):
    model = build(kind, method).eval()
    x = inputs(kind)
    m = get_adapter(method)
    trainable = m.trainable_keys(model)
    prefix = "accumulator." if method == "accumulator" else "exit_heads."
    assert trainable and all(k.startswith(prefix) for k in trainable)
    assert set(m.payload_keys(model)) == trainable  # exactly the method's modules travel
    with torch.no_grad():
        last = model(x)
        assert last.shape == (4, 3)
        model.exit_plan.output = "all"
        every = model(x)
        model.exit_plan.output = "one"
        assert every.shape == (DEPTH, 4, 3)
        assert torch.allclose(every[-1], last)
        for k in range(DEPTH):
            model.exit_plan.exit = k
            assert torch.allclose(model(x), every[k], atol=1e-6)
    # The blocks are restored after every call (the model's block list is not truncated).
    assert len(model.blocks) == DEPTH


@pytest.mark.parametrize("method", EXIT_METHODS)
def test_training_step_changes_only_the_payload_and_round_trips(method):
    m = get_adapter(method, {"exits": "anytime"})
    model = build("vit", method, {"exits": "anytime"}, num_classes=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.exit_plan.begin_client(0, 7)
    res = train_locally(
        model,
        before,
        toy_data(64),
        np.arange(64),
        lr=0.1,
        cfg=LocalConfig(batch_size=16, momentum=0.9),
        seed=1,
        trainable=m.trainable_keys(model),
    )
    changed = {k for k in before if not torch.equal(before[k], res.state[k])}
    assert changed and changed <= set(m.payload_keys(model))
    # The payload round-trips into a fresh model: same outputs at every exit.
    dst = build("vit", method, {"exits": "anytime"}, num_classes=2)
    m.load_payload(
        dst,
        payload.decode(
            payload.encode({k: res.state[k] for k in changed | set(m.payload_keys(model))})
        ),
    )
    model.load_state_dict(res.state)
    x = inputs("vit")
    model.eval().exit_plan.output = dst.eval().exit_plan.output = "all"
    with torch.no_grad():
        assert torch.equal(model(x), dst(x))


# Accumulator history (seed 001 §4.2, eqs. 7 and 8) on a hand-checkable encoder.


class _AddBlock(nn.Module):
    """A frozen 'transformer block' that adds a constant vector to every token."""

    def __init__(self, c: list[float]) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c


class _TinyEncoder(nn.Module):
    """CLS plumbing (``blocks``, ``cls_index``, ``hidden_size``) over input tokens (B, T, 2):
    z^0 is the input's CLS token, block k adds c_k."""

    cls_index = 0
    hidden_size = 2

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_AddBlock([1.0, 1.0]), _AddBlock([0.0, 3.0])])
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


class _MeanMix(nn.Module):
    """Stands in for phi: h_j = t_j + mean_j(t_j) (records its inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        self.seen.append(t.detach().clone())
        return t + t.mean(dim=1, keepdim=True)


def _accumulator_model() -> tuple[nn.Module, _MeanMix]:
    model = adapt(_TinyEncoder(), "accumulator", options={"heads": 1})
    acc = model.accumulator
    mix = _MeanMix()
    acc.block = mix
    acc.head = nn.Identity()  # psi = identity: the exit logits are h_0 + z
    with torch.no_grad():
        acc.client_token.copy_(torch.tensor([1.0, 0.0]))
        acc.layer_embed.copy_(torch.tensor([[0.0, 1.0], [0.0, -1.0], [2.0, 0.0]]))
    return model.eval(), mix


def test_accumulator_history_starts_at_the_embedding_cls_eq7_eq8():
    model, mix = _accumulator_model()
    # p' = [p'_0, p'_1, p'_2]: the embedding level plus one per block (L + 1 rows)
    assert tuple(model.accumulator.layer_embed.shape) == (3, 2)
    x = torch.tensor([[[2.0, 2.0], [5.0, 7.0]]])  # (B=1, T=2, H=2); z^0 = (2, 2)
    model.exit_plan.output = "all"
    with torch.no_grad():
        logits = model(x)  # (E=2, 1, 2)
    # exit 0 (l = 1): z^1 = z^0 + (1, 1) = (3, 3)
    #   tokens = [z_client, z^0 + p'_0, z^1 + p'_1] = [(1, 0), (2, 3), (3, 2)], mean (2, 5/3)
    #   h = tokens + mean; eq. 8: y^1 = h_0 + z^1 = (3, 5/3) + (3, 3) = (6, 14/3)
    #   eq. 7: z^1 <- h_2 = (5, 11/3), the CLS the next block reads
    assert torch.allclose(mix.seen[0], torch.tensor([[[1.0, 0.0], [2.0, 3.0], [3.0, 2.0]]]))
    assert torch.allclose(logits[0], torch.tensor([[6.0, 14.0 / 3]]))
    # exit 1 (l = 2): z^2 = (5, 11/3) + (0, 3) = (5, 20/3); the history holds the original z^1
    #   tokens = [(1, 0), (2, 3), (3, 2), z^2 + p'_2 = (7, 20/3)], mean (13/4, 35/12)
    #   eq. 8: y^2 = h_0 + z^2 (original CLS, not the revised one) = (37/4, 115/12)
    assert torch.allclose(
        mix.seen[1], torch.tensor([[[1.0, 0.0], [2.0, 3.0], [3.0, 2.0], [7.0, 20.0 / 3]]])
    )
    assert torch.allclose(logits[1], torch.tensor([[37.0 / 4, 115.0 / 12]]))
    # the history is per call: a second forward sees the same tokens
    mix.seen.clear()
    with torch.no_grad():
        assert torch.allclose(model(x), logits)
    assert len(mix.seen) == 2 and mix.seen[0].shape == (1, 3, 2)


def test_anytime_sampling_covers_every_exit_deterministically():
    model = build("bert", "accumulator", {"exits": "anytime"})
    plan = model.exit_plan

    def draws(client: int, seed: int) -> list[int]:
        plan.begin_client(client, seed)
        return [plan.stop_exit(training=True) for _ in range(40)]

    first = draws(0, 123)
    assert set(first) == set(range(DEPTH))
    assert draws(0, 123) == first  # from (seed, round, client) -> the client seed, and step
    assert draws(0, 124) != first


def test_anytime_exits_are_uniform_per_step():
    """Seed 001 App. A: the exit of each training iteration is drawn from a uniform
    distribution over the exits; draws differ between steps and between clients."""
    plan = ExitPlan(num_exits=4, mode="anytime")
    draws = []
    for client in range(4):
        plan.begin_client(client, 1000 + client)
        draws += [plan.stop_exit(training=True) for _ in range(1000)]
    counts = np.bincount(draws, minlength=4)
    # 4000 draws: each count ~ 1000 +- 27 (binomial sd); 5 sd
    assert np.all(np.abs(counts - 1000) < 140), counts
    pairs = np.bincount(4 * np.array(draws[:-1]) + np.array(draws[1:]), minlength=16)
    assert np.all(np.abs(pairs - 3999 / 16) < 5 * np.sqrt(3999 / 16)), pairs  # step to step
    plan.begin_client(0, 1000)
    assert plan.client_exits(0, 1000, 1000) == draws[:1000]  # what the engine groups by


def _block_calls(model: nn.Module) -> list[int]:
    calls: list[int] = []
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda *_, i=i: calls.append(i))
    return calls


@pytest.mark.parametrize("kind", BUILDERS)
def test_multitier_clients_never_run_past_their_tier(kind):
    model = build(kind, "accumulator", {"exits": "multitier", "tiers": [0, 1]}).train()
    calls = _block_calls(model)
    x = inputs(kind)
    model.exit_plan.begin_client(0, 5)  # tier 0: block 0 only
    assert model(x).shape == (4, 3)
    assert calls == [0]
    calls.clear()
    model.exit_plan.begin_client(3, 5)  # client 3 -> tiers[3 % 2] = 1: both blocks
    model(x)
    assert calls == [0, 1]
    calls.clear()
    model.exit_plan.begin_client(2, 5)  # balanced: even clients tier 0
    model(x).sum().backward()
    assert calls == [0]


def test_engine_logs_accuracy_at_every_exit():
    method = "accumulator"
    options = {"exits": "anytime"}
    m = get_adapter(method, options)
    model = build("vit", method, options, num_classes=2)
    sim = Simulation(
        model_fn=functools.partial(build, "vit", method, options, 2),
        workers=0,
        algorithm=build_algorithm("fedavg"),
        train=toy_data(),
        test=toy_data(100, seed=1),
        shards=[np.arange(0, 200), np.arange(200, 400)],
        local=LocalConfig(batch_size=32),
        lr_schedule=LRSchedule(lr=0.05),
        federation=FederationConfig(rounds=2, clients_per_round=2),
        payload_keys=m.payload_keys(model),
        trainable=m.trainable_keys(model),
    )
    history = sim.run()
    last = history.rounds[-1]
    accs = assert_exit_accuracies(model, sim, last, toy_data(100, seed=1))
    assert last.upload_bytes == 2 * len(payload.encode(m.payload(model)))
    # the run summary and the console table carry the per-exit accuracies
    assert exit_accuracies(history) == accs
    record = {
        "algorithm": "fedavg",
        "adapter": method,
        "partition": "iid",
        "rounds": history.to_dict()["rounds"],  # as metrics.json holds them: L capped by them
        "final_accuracy": last.accuracy,
        "mean_accuracy_last_L": last.accuracy,
        "last_rounds_L": 1,
        "upload_bytes": 1,
        "download_bytes": 1,
        "upload_bytes_per_round": 1,
        "download_bytes_per_round": 1,
        "final_accuracy_exits": accs,
    }
    table = results_table([record])
    assert table.columns[-1].header == "acc per exit"
    assert list(table.columns[-1].cells) == [" ".join(f"{100 * a:.1f}" for a in accs)]
    personal = {"payload": {"mean_accuracy_after": 0.75, "mean_gain": 0.125}}
    table = results_table([{**record, "personalization": personal}])
    assert list(table.columns[-1].cells) == ["payload 75.0 (+12.5)"]


KEY = "grid.adapter_options.accumulator"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # depth-dependent: found when the method is injected
        ({"exit": 2}, "adapter 'accumulator': exit 2 is beyond the model's exits 0..1"),
        (
            {"exits": "multitier", "tiers": [0, 5]},
            "adapter 'accumulator': tier 5 is beyond the model's exits 0..1",
        ),
        ({"heads": 5}, "adapter 'accumulator': heads 5 must divide the width"),
        # the options alone
        ({"exits": "multitier"}, f"{KEY}: exits: multitier needs tiers (e.g. [1, 3, 5])"),
        (
            {"exits": "sometimes"},
            f"{KEY}.exits: must be 'last', 'anytime' or 'multitier' (got 'sometimes')",
        ),
        ({"tiers": [1]}, f"{KEY}: tiers are only used with exits: multitier"),
        (
            {"exits": "multitier", "tiers": [1, -1]},
            f"{KEY}.tiers.1: must be greater than or equal to 0 (got -1)",
        ),
        (
            {"exits": "multitier", "tiers": [True]},
            f"{KEY}.tiers.0: must be a valid integer (got True)",
        ),
        ({"exit": -1}, f"{KEY}.exit: must be greater than or equal to 0 (got -1)"),
        ({"exit": "1"}, f"{KEY}.exit: must be a valid integer (got '1')"),
        ({"heads": 0}, f"{KEY}.heads: must be greater than or equal to 1 (got 0)"),
        ({"mlp_ratio": float("nan")}, f"{KEY}.mlp_ratio: must be a finite number (got nan)"),
        (
            {"depth": 3},
            f"unknown key '{KEY}.depth'; allowed: exits, tiers, exit, heads, mlp_ratio",
        ),
    ],
)
def test_bad_exit_options_stop_in_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        build("bert", "accumulator", options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_layerwise_methods_take_the_exit_options_only():
    with pytest.raises(ConfigError) as err:
        get_adapter("lw_linear", {"mlp_ratio": 2})
    assert str(err.value) == (
        "unknown key 'grid.adapter_options.lw_linear.mlp_ratio'; allowed: exits, tiers, exit"
    )
    with pytest.raises(ConfigError) as err:
        get_adapter("lw_mlp", {"heads": 2})
    assert str(err.value) == (
        "unknown key 'grid.adapter_options.lw_mlp.heads'; allowed: exits, tiers, exit, mlp_ratio"
    )
    m = get_adapter("lw_linear", {"exits": "multitier", "tiers": [0, 1], "exit": 0})
    assert m.options == ExitOptions(exits="multitier", tiers=(0, 1), exit=0)
    plan = build("bert", "lw_linear", {"exits": "multitier", "tiers": [0, 1]}).exit_plan
    assert (plan.mode, plan.tiers, plan.exit) == ("multitier", (0, 1), None)
    assert get_adapter("accumulator", {"tiers": None}).options == AccumulatorOptions()


def test_exit_methods_do_not_apply_to_cnns():
    from tests.helpers import TinyAdaptable

    with pytest.raises(ConfigError, match="not a transformer with CLS plumbing"):
        adapt(TinyAdaptable(), "accumulator")
    assert get_adapter("lw_mlp").merge(build("bert", "lw_mlp")) is None
