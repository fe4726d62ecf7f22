"""Adapter methods: which parameters train and travel (one registry for every backbone).

One method = one module (``full``, ``head``, ``bn_head``, ``residual``, ``lora``,
``lw_linear``, ``lw_mlp``, ``accumulator``: early exits, ``models.adapters.exits``; their ``_pa``
variants with parallel adapters, ``models.adapters.exits_pa``); the contract is
``models.adapters.base.AdapterMethod``. ``adapt(model, name)`` injects a method into a
backbone and freezes the base; a method that cannot adapt the backbone stops with one line
saying why and which methods apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from fedcore.errors import ConfigError, UnknownNameError
from models.adapters.accumulator import AccumulatorMethod
from models.adapters.base import AdapterCounts, AdapterMethod, NoOptions
from models.adapters.bn_head import BNHead
from models.adapters.bottleneck import Houlsby, Parallel, Pfeiffer
from models.adapters.exits_pa import AccumulatorPA, LayerwiseLinearPA, LayerwiseMLPPA
from models.adapters.full import Full
from models.adapters.head import Head
from models.adapters.lora import Lora
from models.adapters.lw_linear import LayerwiseLinear
from models.adapters.lw_mlp import LayerwiseMLP
from models.adapters.residual import Residual, ResidualConv2d
from models.registry import get_model

ADAPTER_METHODS: dict[str, type[AdapterMethod]] = {
    cls.name: cls
    for cls in (
        Full,
        Head,
        BNHead,
        Residual,
        Lora,
        Houlsby,
        Pfeiffer,
        Parallel,
        LayerwiseLinear,
        LayerwiseMLP,
        AccumulatorMethod,
        LayerwiseLinearPA,
        LayerwiseMLPPA,
        AccumulatorPA,
    )
}


def list_adapters() -> list[str]:
    return sorted(ADAPTER_METHODS)


def check_adapter(name: str) -> str:
    if name not in ADAPTER_METHODS:
        raise UnknownNameError("adapter method", name, ADAPTER_METHODS)
    return name


def get_adapter(name: str, options: Mapping[str, Any] | object | None = None) -> AdapterMethod:
    """Method ``name`` with its options (``grid.adapter_options[name]``: a mapping or the
    method's ``Options`` instance; None: the defaults)."""
    return ADAPTER_METHODS[check_adapter(name)].from_options(options)


def applicable_adapters(model: nn.Module) -> list[str]:
    return [n for n in list_adapters() if ADAPTER_METHODS[n]().applies_to(model) is None]


def adapt(
    model: nn.Module,
    name: str,
    model_name: str | None = None,
    options: Mapping[str, Any] | object | None = None,
) -> nn.Module:
    """Inject adapter method ``name`` into ``model`` (in place) and freeze its base."""
    method = get_adapter(name, options)
    reason = method.applies_to(model)
    if reason is not None:
        raise ConfigError(
            f"adapter {name!r} does not apply to model {model_name or type(model).__name__!r}: "
            f"{reason}; methods that apply: {', '.join(applicable_adapters(model))}"
        )
    return method.inject(model)


def adapted_model(
    model_name: str,
    adapter: str,
    adapter_options: Mapping[str, Any] | object | None = None,
    **kwargs: object,
) -> nn.Module:
    """A registered backbone with ``adapter`` injected (picklable via functools.partial)."""
    model = get_model(model_name, **kwargs)  # type: ignore[arg-type]
    return adapt(model, adapter, model_name, adapter_options)


__all__ = [
    "ADAPTER_METHODS",
    "AdapterCounts",
    "AdapterMethod",
    "Lora",
    "NoOptions",
    "ResidualConv2d",
    "adapt",
    "adapted_model",
    "applicable_adapters",
    "check_adapter",
    "get_adapter",
    "list_adapters",
]
