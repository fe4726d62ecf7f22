"""Adapter options: every method declares a frozen options dataclass (``AdapterMethod.Options``)
validated on one path (``AdapterMethod.from_options`` -> ``fedcore.options.parse``); a bad key
or value is one line naming ``grid.adapter_options.<method>.<option>``; a typed instance is
taken as it is (models/adapters/base.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedcore.errors import ConfigError
from fedcore.options import option_names
from models.adapters import ADAPTER_METHODS, adapt, adapted_model, get_adapter
from models.adapters.base import AdapterMethod, NoOptions
from models.adapters.bottleneck import BottleneckOptions, ParallelOptions
from models.adapters.lora import LoraOptions

METHODS = sorted(ADAPTER_METHODS)


@pytest.mark.parametrize("name", METHODS)
def test_options_are_a_frozen_dataclass_that_refuses_unknown_keys(name):
    cls = ADAPTER_METHODS[name]
    opts = cls.Options
    assert dataclasses.is_dataclass(opts) and opts.__dataclass_params__.frozen
    defaults = opts()
    for field in option_names(opts):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(defaults, field, getattr(defaults, field))
    with pytest.raises(ConfigError) as err:
        get_adapter(name, {"no_such_option": 1})
    allowed = ", ".join(option_names(opts)) or "none"
    assert str(err.value) == (
        f"unknown key 'grid.adapter_options.{name}.no_such_option'; allowed: {allowed}"
    )


@pytest.mark.parametrize("name", METHODS)
def test_one_parsing_path_and_defaults(name):
    cls = ADAPTER_METHODS[name]
    assert "from_options" not in vars(cls), f"{name} overrides from_options"
    assert cls().options == cls.Options() == cls.from_options(None).options
    assert get_adapter(name, {}).options == cls.Options()
    typed = cls.Options()
    assert get_adapter(name, typed).options is typed  # an instance is taken as it is


@pytest.mark.parametrize("name", METHODS)
def test_options_of_another_kind_are_refused_in_one_line(name):
    other = LoraOptions() if name != "lora" else NoOptions()
    with pytest.raises(ConfigError) as err:
        get_adapter(name, other)
    assert str(err.value).startswith(f"grid.adapter_options.{name}: must be a mapping of options")
    with pytest.raises(ConfigError, match=rf"^grid.adapter_options.{name}: must be a mapping"):
        get_adapter(name, [1, 2])
    with pytest.raises(TypeError, match="from_options"):
        ADAPTER_METHODS[name]({"r": 1})  # the constructor takes the typed options only


def test_no_options_methods_name_none_allowed():
    for name in ("full", "head", "bn_head", "residual"):
        assert ADAPTER_METHODS[name].Options is NoOptions
    with pytest.raises(ConfigError) as err:
        get_adapter("head", {"r": 4})
    assert str(err.value) == "unknown key 'grid.adapter_options.head.r'; allowed: none"


def test_bottleneck_defaults_per_method():
    """Each bottleneck method keeps its default reduction factor (16, seed 003) and only
    ``parallel`` takes ``scaling`` (He et al.'s 4)."""
    for name in ("houlsby", "pfeiffer"):
        m = get_adapter(name)
        assert m.Options is BottleneckOptions and m.reduction_factor == 16  # type: ignore[attr-defined]
    p = get_adapter("parallel")
    assert p.Options is ParallelOptions
    assert (p.reduction_factor, p.scaling) == (16, 4.0)  # type: ignore[attr-defined]
    q = get_adapter("parallel", {"scaling": 2, "reduction_factor": 4})
    assert q.options == ParallelOptions(reduction_factor=4, scaling=2.0)
    assert isinstance(q.options.scaling, float)


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("lora", {"r": "8"}, "grid.adapter_options.lora.r: must be a valid integer (got '8')"),
        ("lora", {"r": False}, "grid.adapter_options.lora.r: must be a valid integer (got False)"),
        (
            "lora",
            {"dropout": float("nan")},
            "grid.adapter_options.lora.dropout: must be a finite number (got nan)",
        ),
        (
            "houlsby",
            {"reduction_factor": 4.0},
            "grid.adapter_options.houlsby.reduction_factor: must be a valid integer (got 4.0)",
        ),
        (
            "parallel",
            {"scaling": "4"},
            "grid.adapter_options.parallel.scaling: must be a valid number (got '4')",
        ),
        (
            "parallel",
            {"scaling": True},
            "grid.adapter_options.parallel.scaling: must be a valid number (got True)",
        ),
        (
            "accumulator",
            {"heads": "2"},
            "grid.adapter_options.accumulator.heads: must be a valid integer (got '2')",
        ),
        (
            "accumulator",
            {"mlp_ratio": float("nan")},
            "grid.adapter_options.accumulator.mlp_ratio: must be a finite number (got nan)",
        ),
        (
            "lw_mlp",
            {"exit": True},
            "grid.adapter_options.lw_mlp.exit: must be a valid integer (got True)",
        ),
    ],
)
def test_wrong_types_are_one_line(name, options, needle):
    with pytest.raises(ConfigError) as err:
        get_adapter(name, options)
    assert str(err.value) == needle


def test_typed_options_build_the_same_model_as_the_mapping():
    """``adapt`` / ``adapted_model`` take the typed options ``tasks.config`` hands over:
    the same modules, keys and initial values as the mapping."""
    kw = {"num_classes": 10, "in_channels": 1, "width": 0.125}
    torch.manual_seed(0)
    a = adapted_model("resnet26", "lora", {"r": 2}, **kw)
    torch.manual_seed(0)
    b = adapted_model("resnet26", "lora", LoraOptions(r=2), **kw)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    method: AdapterMethod = get_adapter("lora", LoraOptions(r=2))
    assert method.payload_keys(a) == method.payload_keys(b)
    c = adapt(torch.nn.Sequential(torch.nn.Linear(3, 2)), "head", None, NoOptions())
    assert [n for n, p in c.named_parameters() if p.requires_grad] == ["0.weight", "0.bias"]
