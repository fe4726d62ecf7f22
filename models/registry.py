"""The backbones: one table of keyword-only builders (torchvision ``get_model`` style),
each imported when its model is first used.

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

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from torch import nn

from fedcore.errors import ConfigError, UnknownNameError
from fedcore.inputs import InputSpec
from fedcore.options import dump, option_names, parse, signature_options

Builder = Callable[..., nn.Module]
# A backbone's input needs, fixed or as a function of its options (e.g. ``pretrained``).
SpecFn = Callable[..., InputSpec]
Task = Literal["image", "classify", "next_token"]
_COMMON = ("num_classes", "in_channels", "input_size")
OPTIONS_KEY = "model.options"  # the prefix of every option error


@dataclass(frozen=True)
class ModelEntry:
    """A backbone of :data:`MODELS`: its builder, as ``module:function`` (the module is
    imported when the model is first used, never by ``import models``: a model's heavy
    dependencies load only for runs of that model), and what it takes: images, texts to
    classify (``classify``) or token streams, predicting the next token (``next_token``)."""

    builder: str
    task: Task = "image"


# The backbones, in one table. Adding one: its builder in a module under models/, decorated
# with ``@backbone(...)``, and its line here (docs/extending.md).
MODELS: dict[str, ModelEntry] = {
    "cifar_cnn": ModelEntry("models.cnn:cifar_cnn"),
    "lenet5": ModelEntry("models.cnn:lenet5"),
    "resnet26": ModelEntry("models.resnet:resnet26"),
    "efficientnet_lite0": ModelEntry("models.efficientnet:efficientnet_lite0"),
    "tv_resnet18": ModelEntry("models.pretrained:tv_resnet18"),
    "tv_resnet34": ModelEntry("models.pretrained:tv_resnet34"),
    "tv_resnet50": ModelEntry("models.pretrained:tv_resnet50"),
    "vit_small": ModelEntry("models.vit:vit_small"),
    "deit_small": ModelEntry("models.vit:deit_small"),
    "vit_base": ModelEntry("models.vit:vit_base"),
    "minilm": ModelEntry("models.minilm:minilm", "classify"),
    "text_hf": ModelEntry("models.minilm:text_hf", "classify"),
    "gpt2_small": ModelEntry("models.decoder:gpt2_small", "next_token"),
    "gpt2_hf": ModelEntry("models.decoder:gpt2_hf", "next_token"),
}


def backbone(
    input_spec: InputSpec | SpecFn | None = None, tokenizer: Callable[..., Any] | None = None
) -> Callable[[Builder], Builder]:
    """Mark a module-level function as a backbone builder (its line in :data:`MODELS` names
    it; nothing is registered). Its options dataclass is derived from its keyword options and
    set as ``<builder>.Options``, where pickle finds it; ``input_spec`` says what input it
    needs (None: the data's own); ``tokenizer``: a text model's, built from the model's
    validated options (``models.text.text_tokenizer``)."""

    def wrap(fn: Builder) -> Builder:
        signature_options(fn, f"{fn.__name__}_options", skip=_COMMON)  # sets fn.Options
        fn.input_spec = input_spec  # type: ignore[attr-defined]
        fn.tokenizer = tokenizer  # type: ignore[attr-defined]
        return fn

    return wrap


def entry(name: str) -> ModelEntry:
    """The table's line of backbone ``name`` (an unknown name: one line naming the valid)."""
    if name not in MODELS:
        raise UnknownNameError("model", name, MODELS)
    return MODELS[name]


def builder(name: str) -> Builder:
    """The builder of backbone ``name``, its module imported now."""
    module, _, function = entry(name).builder.partition(":")
    return cast(Builder, getattr(importlib.import_module(module), function))


def list_models() -> list[str]:
    return sorted(MODELS)


def model_options_type(name: str) -> type[Any]:
    """The frozen options dataclass of backbone ``name`` (from its builder's keyword options)."""
    return cast(type[Any], builder(name).Options)  # type: ignore[attr-defined]


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
    spec = builder(name).input_spec or InputSpec()  # type: ignore[attr-defined]
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
    return builder(name)(
        num_classes=num_classes, in_channels=in_channels, input_size=input_size, **dump(opts)
    )


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
