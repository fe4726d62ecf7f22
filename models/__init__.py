"""Backbones (registry of keyword-only builders) and adapter methods."""

from models import cnn as _cnn  # noqa: F401  (registers cifar_cnn, lenet5)
from models import decoder as _decoder  # noqa: F401  (gpt2_small offline, gpt2_hf online)
from models import efficientnet as _efficientnet  # noqa: F401  (efficientnet_lite0, offline)
from models import minilm as _minilm  # noqa: F401  (minilm offline, text_hf online)
from models import pretrained as _pretrained  # noqa: F401  (tv_resnet18/34/50, online)
from models import resnet as _resnet  # noqa: F401  (registers resnet26)
from models import vit as _vit  # noqa: F401  (vit_small, deit_small, vit_base: timm, online)
from models.registry import (
    count_parameters,
    get_model,
    input_spec,
    list_models,
    model_options,
    register_model,
)

__all__ = [
    "count_parameters",
    "get_model",
    "input_spec",
    "list_models",
    "model_options",
    "register_model",
]
