"""Registry of keyword-only backbone builders (torchvision ``get_model`` style)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

from torch import nn

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.inputs import InputSpec
from fedcore.options import signature_options

Builder = Callable[..., nn.Module]
# A backbone's input needs, fixed or as a function of its options (e.g. ``pretrained``).
SpecFn = Callable[..., InputSpec]
_MODELS: dict[str, Builder] = {}
_INPUTS: dict[str, InputSpec | SpecFn] = {}
_COMMON = ("num_classes", "in_channels", "input_size")


def register_model(
    name: str, input_spec: InputSpec | SpecFn | None = None
) -> Callable[[Builder], Builder]:
    """Register a builder; ``input_spec`` says what input it needs (None: the data's own)."""

    def wrap(fn: Builder) -> Builder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = fn
        if input_spec is not None:
            _INPUTS[name] = input_spec
        return fn

    return wrap


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_options(name: str) -> list[str]:
    """The builder's own options (beyond num_classes, in_channels, input_size)."""
    if name not in _MODELS:
        raise UnknownNameError("model", name, _MODELS)
    sig = inspect.signature(_MODELS[name])
    return [p for p in sig.parameters if p not in _COMMON]


@cache
def model_options_type(name: str) -> type[Any]:
    """The frozen options dataclass of backbone ``name`` (from its builder's keyword options)."""
    model_options(name)
    return signature_options(_MODELS[name], f"{name}_options", skip=_COMMON)


def input_spec(name: str, **options: Any) -> InputSpec:
    """What the backbone ``name`` with these options expects (``fedcore.inputs``)."""
    model_options(name)  # unknown name -> one line listing the valid ones
    spec = _INPUTS.get(name, InputSpec())
    if isinstance(spec, InputSpec):
        return spec
    sig = inspect.signature(_MODELS[name])
    defaults = {
        p: v.default for p, v in sig.parameters.items() if v.default is not inspect.Parameter.empty
    }
    return spec(**{k: v for k, v in {**defaults, **options}.items() if k not in _COMMON})


def get_model(
    name: str, *, num_classes: int, in_channels: int = 3, input_size: int = 32, **options: Any
) -> nn.Module:
    allowed = model_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"model {name!r} takes no option {unknown[0]!r}; allowed: {', '.join(allowed) or 'none'}"
        )
    if num_classes < 2:
        raise ConfigError(f"model.num_classes must be >= 2 (got {num_classes})")
    if in_channels < 1:
        raise ConfigError(f"model.in_channels must be >= 1 (got {in_channels})")
    return _MODELS[name](
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, **options
    )


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
