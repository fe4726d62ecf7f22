"""Backbones (one table of keyword-only builders, ``models.registry.MODELS``, each imported
when its model is first used) and adapter methods."""

from models.registry import (
    MODELS,
    backbone,
    count_parameters,
    get_model,
    input_spec,
    list_models,
    model_options,
)

__all__ = [
    "MODELS",
    "backbone",
    "count_parameters",
    "get_model",
    "input_spec",
    "list_models",
    "model_options",
]
