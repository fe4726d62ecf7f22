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
from tests.test_lora import build, tiny_bert


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
            "adapter 'lora' takes no option 'rank'; allowed: r, alpha, dropout, target_modules",
        ),
        ({"r": 0}, "lora option 'r' must be an integer >= 1 (got 0)"),
        ({"r": 2.5}, "lora option 'r' must be an integer >= 1 (got 2.5)"),
        ({"alpha": -1}, "lora option 'alpha' must be a number > 0 (got -1)"),
        ({"dropout": 1.0}, "lora option 'dropout' must be a number in [0, 1) (got 1.0)"),
        ({"target_modules": []}, "lora option 'target_modules' must be a list of module names"),
    ],
)
def test_bad_options_are_one_line(options, needle):
    with pytest.raises(ConfigError) as exc:
        get_adapter("lora", options)
    assert str(exc.value).startswith(needle) and "\n" not in str(exc.value)


def test_options_reach_the_layers():
    o = LoraOptions.parse({"r": 4, "alpha": 8, "dropout": 0.1})
    assert (o.r, o.alpha, o.dropout) == (4, 8.0, 0.1)
    model = build("bert", options={"r": 4, "alpha": 8, "dropout": 0.1})
    layer = next(iter(lora_layers(model).values()))
    assert layer.r["default"] == 4 and layer.scaling["default"] == 2.0
    assert layer.lora_dropout["default"].p == 0.1
    with pytest.raises(ConfigError, match="adapter 'head' takes no options"):
        get_adapter("head", {"r": 4})


def test_vit_weights_offline_are_one_line(monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as exc:
        get_model("deit_small", num_classes=3, input_size=32, pretrained=True)
    msg = str(exc.value)
    assert "\n" not in msg and "deit_small_patch16_224" in msg and "need internet once" in msg


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "grid.adapter_options.lora.r=0"], "lora option 'r' must be an integer >= 1"),
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
