"""The experiment's backbone: its options from ``model.base``, its input, its initial weights.

``model.base`` decides the starting weights: ``none`` (the builder's random initialisation),
``imagenet`` (the model's ImageNet weights: ``pretrained: true``) or ``pretrain`` (the pretrain
stage's backbone, ``tasks/data/pretrain.py``, copied in before the adapter is injected; only the
classifier starts fresh, sized for the federated task).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from fedcore import payload
from fedcore.datasets import DatasetInfo
from fedcore.errors import ConfigError
from fedcore.inputs import ModelInput, resolve_input
from fedcore.protocols import classifier_name
from models import get_model, input_spec, list_models, model_options
from models.adapters import adapt
from models.text import is_next_token_model, is_text_model
from tasks.config import Params

BASE_FILE = "base.pt"


def imagenet_models() -> list[str]:
    return [m for m in list_models() if "pretrained" in model_options(m)]


def backbone_options(params: Params) -> Any:
    """The typed ``model.options`` with ``pretrained`` as ``model.base`` says (for models that
    take it)."""
    name, base = params.model.name, params.model.base
    options = params.model.options
    if base == "pretrain" and is_text_model(name) and not is_next_token_model(name):
        raise ConfigError(
            f"model.base: pretrain trains image backbones and decoders; text model {name!r} "
            f"starts from its own pretrained weights: set model.base: none"
        )
    takes_pretrained = "pretrained" in model_options(name)
    if base == "imagenet":
        if not takes_pretrained:
            raise ConfigError(
                f"model.base: imagenet: model {name!r} has no ImageNet weights; models with "
                f"them: {', '.join(imagenet_models())} (or model.base: pretrain)"
            )
        return replace(options, pretrained=True)
    if takes_pretrained:
        return replace(options, pretrained=False)  # none: random; pretrain: its weights follow
    return options


def model_input(params: Params, info: DatasetInfo) -> ModelInput:
    """What every batch becomes for this backbone (size, channels, normalisation)."""
    spec = input_spec(params.model.name, backbone_options(params))
    return resolve_input(
        spec,
        info.input_shape,
        info.mean,
        info.std,
        params.model.input_size,
        model=params.model.name,
    )


def load_base(model: nn.Module, path: str | Path, model_name: str = "model") -> None:
    """Copy a pretrained backbone's state into ``model``: every entry but the classifier (a
    decoder's tied LM head is its input embedding: part of the base, copied too)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"model.base: pretrain: no base at {path}; run: fedapt pretrain (or dvc repro pretrain)"
        )
    state = payload.decode(path.read_bytes())
    head = classifier_name(model) or ""
    if head and isinstance(model.get_submodule(head), nn.Embedding):
        head = ""  # tied LM head (models/decoder.py): the embedding is pretrained weights

    def is_head(key: str) -> bool:
        return bool(head) and key.startswith(head + ".")

    own = {k: v for k, v in model.state_dict().items() if not is_head(k)}
    base = {k: v for k, v in state.items() if not is_head(k)}
    missing = sorted(set(own) - set(base))
    extra = sorted(set(base) - set(own))
    shapes = sorted(k for k in set(own) & set(base) if own[k].shape != base[k].shape)
    if missing or extra or shapes:
        key = (missing or extra or shapes)[0]
        what = "missing" if missing else "unexpected" if extra else "shape differs"
        raise ConfigError(
            f"base {path} does not fit model {model_name!r} ({what}: {key}); it was trained for "
            f"another model, options or input; re-run: fedapt pretrain"
        )
    model.load_state_dict(base, strict=False)


def build_backbone(
    model_name: str,
    adapter: str,
    base_path: str | None = None,
    adapter_options: Any = None,  # the method's typed options (or a mapping)
    **kwargs: Any,
) -> nn.Module:
    """The registered backbone, the pretrain base copied in (if any), ``adapter`` injected.
    Module-level so that ``functools.partial`` of it pickles to worker processes."""
    model = get_model(model_name, **kwargs)
    if base_path is not None:
        load_base(model, base_path, model_name)
    return adapt(model, adapter, model_name, adapter_options)
