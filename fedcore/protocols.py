"""What the engine and the algorithms may ask of a model: its declared capabilities.

``fedcore`` imports nothing above it; ``models`` implements these (structurally: a backbone
or adapter method has the attributes, no base class is required). Everything here is
optional: a plain ``nn.Module`` classifier trains with every algorithm and adapter-free
method. fedcore reads a capability only through the accessors below, never by scattered
``getattr`` calls.

* ``classifier_name``: the attribute path of the final classifier (the ``head`` adapter
  trains it; personalization fine-tunes it): :func:`classifier_name`.
* ``layer_groups()``: the model's layers from input to output as state-dict key prefixes
  (FedNILO freezes them front to back): :func:`layer_groups`.
* a transformer whose CLS state after every block can be read (``blocks``, ``cls_index``,
  ``hidden_size``): the early-exit methods build on it: :func:`cls_blocks`,
  :func:`cls_index`, :func:`hidden_size`.
* a causal transformer decoder (``blocks``, ``is_decoder``; GPT-2) whose logits are its LM
  head's at the last position: the block adapters (bottleneck, LoRA) apply to its blocks as
  to an encoder's, the CLS-based early exits do not: :func:`transformer_blocks`.
* early exits (seed 001 §5): an ``exit_plan`` (:class:`ExitPlan`) decides which exit a
  forward call ends at; the engine tells it whose local training starts, the cohort engine
  forces an exit per group of clients and asks which exits a client's steps take. An
  early-exit method whose exit ``k`` is one head module reading the CLS state after block
  ``k`` and nothing else declares ``exit_head_path(k)`` (the cohort engine caches those CLS
  states): :func:`exit_heads`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import nn


class ExitPlan(Protocol):
    """Which exit a forward call ends at (``models.adapters.exits.ExitPlan``)."""

    num_exits: int
    exit: int | None  # the inference exit (None: the last)
    output: str  # "one": the chosen exit's logits (B, C); "all": every exit's (E, B, C)
    forced: int | None  # set by the cohort engine: the exit every training call ends at
    blocks_path: str  # the encoder's block list in the model

    def begin_client(self, client_id: int, seed: int) -> None: ...

    def client_exits(self, client_id: int, seed: int, steps: int) -> Sequence[int]: ...


def exit_plan(model: nn.Module) -> ExitPlan | None:
    """The model's exit plan; None for a model without early exits."""
    return getattr(model, "exit_plan", None)


def exit_heads(model: nn.Module) -> list[str] | None:
    """Paths of the exit heads, first exit first, when the model's early-exit method declares
    them (``exit_head_path``); else None."""
    plan, method = exit_plan(model), getattr(model, "exit_method", None)
    if plan is None or not callable(getattr(method, "exit_head_path", None)):
        return None
    return [method.exit_head_path(k) for k in range(plan.num_exits)]  # type: ignore[union-attr]


def cls_index(model: nn.Module) -> int:
    """Position of the CLS token in a CLS encoder's sequence (0 when undeclared)."""
    return int(getattr(model, "cls_index", 0))


def classifier_name(model: nn.Module) -> str | None:
    """The attribute path of the model's final classifier when it declares one
    (:class:`Classifier`); None when it does not."""
    name = getattr(model, "classifier_name", None)
    return name if isinstance(name, str) and name else None


def layer_groups(model: nn.Module) -> list[list[str]] | None:
    """The model's layers from input to output (``layer_groups()``); None if undeclared."""
    fn = getattr(model, "layer_groups", None)
    return None if fn is None else [list(g) for g in fn()]


def cls_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The block list of a CLS encoder (ModuleList or Sequential); None if the model
    is not one (a CNN may have ``blocks`` too, ResNet26's stages: no ``cls_index`` there)."""
    blocks = getattr(model, "blocks", None)
    ok = isinstance(blocks, nn.ModuleList | nn.Sequential) and hasattr(model, "cls_index")
    return blocks if ok else None


def transformer_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The blocks of a CLS encoder or of a decoder; None for other models."""
    blocks = cls_blocks(model)
    if blocks is None and getattr(model, "is_decoder", False) is True:
        found = getattr(model, "blocks", None)
        blocks = found if isinstance(found, nn.ModuleList | nn.Sequential) else None
    return blocks


def hidden_size(model: nn.Module, default: int) -> int:
    """The width of a CLS encoder's CLS state (``default`` when undeclared)."""
    return int(getattr(model, "hidden_size", default))
