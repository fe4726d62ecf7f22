"""Registry of keyword-only backbone builders (torchvision ``get_model`` style).

A builder's options are its keyword parameters beyond ``num_classes``, ``in_channels`` and
``input_size``; their annotations carry the allowed values (``fedcore.options``: ``Int``,
``Float``, ``Literal``, ``annotated_types`` bounds) and :func:`model_options_type` turns them
into the backbone's frozen options dataclass. :func:`get_model` and :func:`input_spec`
validate options through it (``fedcore.options.parse``): a bad key or value is one line,
``model.options.<option>: must be ... (got ...)`` or ``unknown key 'model.options.<key>';
allowed: ...``. A rule no annotation can say (one option against another, or against the
input size) stays a one-line ``ConfigError`` in the builder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.inputs import InputSpec
from fedcore.options import dump, option_names, parse, signature_options

Builder = Callable[..., nn.Module]
# A backbone's input needs, fixed or as a function of its options (e.g. ``pretrained``).
SpecFn = Callable[..., InputSpec]
_MODELS: dict[str, Builder] = {}
_INPUTS: dict[str, InputSpec | SpecFn] = {}
_OPTIONS: dict[str, type[Any]] = {}  # name -> its builder's options dataclass
_COMMON = ("num_classes", "in_channels", "input_size")
OPTIONS_KEY = "model.options"  # the prefix of every option error


def register_model(
    name: str, input_spec: InputSpec | SpecFn | None = None
) -> Callable[[Builder], Builder]:
    """Register a builder; ``input_spec`` says what input it needs (None: the data's own).
    Its options dataclass is derived here, at import, and set as ``<builder>.Options``, where
    pickle finds it (the builder must then be a module-level name of its module)."""

    def wrap(fn: Builder) -> Builder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _OPTIONS[name] = signature_options(fn, f"{name}_options", skip=_COMMON)  # fn.Options
        _MODELS[name] = fn
        if input_spec is not None:
            _INPUTS[name] = input_spec
        return fn

    return wrap


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_options_type(name: str) -> type[Any]:
    """The frozen options dataclass of backbone ``name`` (from its builder's keyword options)."""
    if name not in _MODELS:
        raise UnknownNameError("model", name, _MODELS)
    return _OPTIONS[name]


def model_options(name: str) -> list[str]:
    """The builder's own options (beyond num_classes, in_channels, input_size)."""
    return option_names(model_options_type(name))


def parse_model_options(
    name: str, options: Mapping[str, Any] | Any = None, **overrides: Any
) -> Any:
    """The options of backbone ``name`` validated into :func:`model_options_type`: ``options``
    (a mapping, or an instance of that type) with ``overrides`` on top. A bad key or value
    raises the one-line ConfigError ``model.options.<option>: ...``."""
    kind = model_options_type(name)
    if isinstance(options, kind):
        options = dump(options)  # re-validated with the overrides (an instance may be hand-made)
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"{OPTIONS_KEY}: must be a mapping of options or a {kind.__qualname__} (got {options!r})"
        )
    return parse(kind, {**(options or {}), **overrides}, OPTIONS_KEY)


def input_spec(name: str, options: Mapping[str, Any] | Any = None, **kw: Any) -> InputSpec:
    """What the backbone ``name`` with these options expects (``fedcore.inputs``); ``options``
    and ``kw`` as :func:`get_model` takes them (unset options: the builder's defaults)."""
    opts = parse_model_options(name, options, **kw)
    spec = _INPUTS.get(name, InputSpec())
    return spec if isinstance(spec, InputSpec) else spec(**dump(opts))


def get_model(
    name: str,
    *,
    num_classes: int,
    in_channels: int = 3,
    input_size: int = 32,
    options: Mapping[str, Any] | Any = None,
    **kw: Any,
) -> nn.Module:
    """Backbone ``name`` built by its builder. Its options come as ``options`` (a mapping or
    an instance of :func:`model_options_type`) and/or keywords (which win); they are validated
    before anything is built, and the builder gets the validated values."""
    opts = parse_model_options(name, options, **kw)
    if num_classes < 2:
        raise ConfigError(f"model.num_classes must be >= 2 (got {num_classes})")
    if in_channels < 1:
        raise ConfigError(f"model.in_channels must be >= 1 (got {in_channels})")
    return _MODELS[name](
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, **dump(opts)
    )


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
