"""LoRA's options and its one-line errors: target modules, rank/alpha/dropout values, weights
that are not available offline (models/adapters/lora.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedcore.errors import ConfigError
from models import get_model
from models.adapters import adapt, get_adapter
from models.adapters.lora import LoraOptions, lora_layers
from tests.helpers import tiny_bert
from tests.models.adapters.support import build


def test_target_modules_option():
    model = build("bert", options={"target_modules": ["key"], "r": 2})
    names = list(lora_layers(model))
    assert names == [f"bert.encoder.layer.{i}.attention.self.key" for i in range(2)]


def test_unknown_target_module_is_one_line_and_nothing_changes():
    torch.manual_seed(0)
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as exc:
        adapt(model, "lora", "bert", {"target_modules": ["query", "qery"]})
    msg = str(exc.value)
    assert "\n" not in msg
    assert "lora target module 'qery' not found in TextEncoderClassifier" in msg
    assert msg.endswith("available: dense, key, query, value")
    assert list(model.state_dict()) == list(before)  # not injected, not frozen
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ConfigError, match="target module 'classifier' not found"):
        adapt(tiny_bert(), "lora", "bert", {"target_modules": ["classifier"]})


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (
            {"rank": 4},
            "unknown key 'grid.adapter_options.lora.rank'; allowed: r, alpha, dropout, "
            "target_modules",
        ),
        ({"r": 0}, "grid.adapter_options.lora.r: must be greater than or equal to 1 (got 0)"),
        ({"r": 2.5}, "grid.adapter_options.lora.r: must be a valid integer (got 2.5)"),
        ({"r": "4"}, "grid.adapter_options.lora.r: must be a valid integer (got '4')"),
        ({"r": True}, "grid.adapter_options.lora.r: must be a valid integer (got True)"),
        ({"alpha": -1}, "grid.adapter_options.lora.alpha: must be greater than 0 (got -1)"),
        ({"alpha": "16"}, "grid.adapter_options.lora.alpha: must be a valid number (got '16')"),
        ({"alpha": float("nan")}, "grid.adapter_options.lora.alpha: must be a finite number"),
        (
            {"dropout": 1.0},
            "grid.adapter_options.lora.dropout: must be less than 1 (got 1.0)",
        ),
        (
            {"dropout": -0.1},
            "grid.adapter_options.lora.dropout: must be greater than or equal to 0 (got -0.1)",
        ),
        (
            {"target_modules": []},
            "grid.adapter_options.lora.target_modules: must be a list of module names",
        ),
        ({"target_modules": [3]}, "grid.adapter_options.lora.target_modules.0: must be a valid"),
        ({"target_modules": [""]}, "grid.adapter_options.lora.target_modules.0: "),
    ],
)
def test_bad_options_are_one_line(options, needle):
    with pytest.raises(ConfigError) as exc:
        get_adapter("lora", options)
    assert str(exc.value).startswith(needle) and "\n" not in str(exc.value)


def test_options_reach_the_layers():
    o = get_adapter("lora", {"r": 4, "alpha": 8, "dropout": 0.1}).options
    assert o == LoraOptions(r=4, alpha=8.0, dropout=0.1)
    assert isinstance(o.alpha, float) and isinstance(o.dropout, float)
    model = build("bert", options={"r": 4, "alpha": 8, "dropout": 0.1})
    layer = next(iter(lora_layers(model).values()))
    assert layer.r["default"] == 4 and layer.scaling["default"] == 2.0
    assert layer.lora_dropout["default"].p == 0.1
    with pytest.raises(
        ConfigError, match=r"unknown key 'grid.adapter_options.head.r'; allowed: none"
    ):
        get_adapter("head", {"r": 4})


def test_typed_options_are_taken_as_they_are():
    """A ``LoraOptions`` instance (what ``tasks.config`` hands over) builds the same model as
    the mapping; a name alone is a list of one."""
    o = LoraOptions(r=2, target_modules=("key",))
    assert get_adapter("lora", o).options is o
    a, b = build("bert", options=o), build("bert", options={"r": 2, "target_modules": "key"})
    assert list(lora_layers(a)) == list(lora_layers(b))
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_vit_weights_offline_are_one_line(monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as exc:
        get_model("deit_small", num_classes=3, input_size=32, pretrained=True)
    msg = str(exc.value)
    assert "\n" not in msg and "deit_small_patch16_224" in msg and "need internet once" in msg


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--set", "grid.adapter_options.lora.r=0"],
            "grid.adapter_options.lora.r: must be greater than or equal to 1 (got 0)",
        ),
        pytest.param(  # found when the preflight builds the model: after loading the data
            ["--set", "grid.adapter_options.lora.target_modules=[qery]"],
            "lora target module 'qery' not found in CifarCNN",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_lora_options_stop_the_run_in_one_line(tmp_path, args, needle):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(
        app,
        [
            "run",
            "--params",
            str(REPO / "params.yaml"),
            "--set",
            "storage.bucket=null",
            "--set",
            f"experiment.reports_dir={tmp_path / 'reports'}",
            "--set",
            f"data.root={REPO / 'data/raw'}",
            "--set",
            "data.train_subset=200",
            "--set",
            "grid.adapters=[full,lora]",
            *args,
        ],
    )
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert needle in text and len(text.splitlines()) == 1, text
    assert not (tmp_path / "reports").exists()


def test_vit_weights_with_the_hub_unreachable_fail_fast(monkeypatch):
    """No HF_HUB_OFFLINE, but no route to the hub: the cache only, no minute of retries."""
    import huggingface_hub.constants as hf

    import models.timm_vit as tv

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(tv, "_reachable", lambda endpoint: False)
    with pytest.raises(ConfigError, match="could not be downloaded"):
        get_model("vit_small", num_classes=3, input_size=32, pretrained=True)
    assert hf.HF_HUB_OFFLINE is False  # restored
