"""The adapter-method contract shared by CNN and transformer adapters (PEFT tuners style).

An adapter method decides, for a backbone, what trains and what travels:

* ``applies_to(model)``: None, or the reason the method cannot adapt this backbone;
* ``inject(model)``: adds the method's modules (in place) and freezes the base: only the
  method's trainable parameters keep ``requires_grad``;
* ``payload_keys(model)`` / ``payload(model)``: the state-dict entries that travel each round,
  i.e. exactly what a client uploads and downloads (below);
* ``load_payload(model, state)``: strict; a payload of another method, backbone or shape is
  refused with the mismatching keys named, and the model is left unchanged;
* ``merge(model)``: a plain model of the backbone's own class, without adapter modules, whose
  outputs equal the adapted model's (None where the math does not allow it);
* ``counts(model)``: parameters and serialized bytes (``fedcore.payload.encode``).

What travels: the trainable parameters, plus the running statistics (``running_mean``,
``running_var``, ``num_batches_tracked``) of every BatchNorm layer whose affine parameters
train. Those statistics are the domain-specific "mu_l, sigma_l" of seed 000 §III that the
server averages with the rest; its 2.58 MB payload counts them (``models/resnet.py``). A
BatchNorm layer whose parameters are frozen is frozen entirely: it normalises with its
running statistics in training too (a forward pre-hook keeps it in eval mode), so they never
change and never travel. With ``full`` the whole state dict travels.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedcore import payload
from fedcore.errors import ConfigError
from fedcore.options import FORBID_EXTRA, parse
from fedcore.protocols import classifier_name


def head_name(model: nn.Module) -> str | None:
    """The classifier's module name: ``model.classifier_name`` (an ``nn.Linear``, or the
    ``nn.Embedding`` of a decoder whose LM head is its input embedding, tied), else the last
    ``nn.Linear``."""
    name = classifier_name(model)
    if name is not None and isinstance(model.get_submodule(name), nn.Linear | nn.Embedding):
        return name
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def tied_head(model: nn.Module) -> bool:
    """The classifier is the input embedding (a GPT-2 LM head: logits = h W_e^T)."""
    name = head_name(model)
    return name is not None and isinstance(model.get_submodule(name), nn.Embedding)


def adapter_head(model: nn.Module) -> str | None:
    """The classifier that adapter methods (``lora``, ``houlsby``, ``pfeiffer``, ``parallel``,
    ``bn_head``, ``residual``) train beside their own modules: :func:`head_name`, except a tied
    LM head, which is the pretrained input embedding and stays frozen with it (seed 003 §3:
    the adapter mechanism "freezes the embedding and transformer layers"; its Table 12 gpt2
    adapter sizes, 1.12 to 6.82 MB, hold no 38.6M-parameter head). ``head`` alone trains it."""
    return None if tied_head(model) else head_name(model)


def is_conv1d(layer: nn.Module | None) -> bool:
    """A transformers ``Conv1D`` (GPT-2's projections: a Linear whose weight is stored
    transposed, (in, out)); recognised without importing transformers."""
    return type(layer).__name__ == "Conv1D" and isinstance(getattr(layer, "nf", None), int)


def batchnorm_names(model: nn.Module) -> list[str]:
    """BatchNorm layers with affine parameters (those an adapter method can train)."""
    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm) and m.affine]


def _use_running_stats(module: nn.Module, args: Any) -> None:
    """Forward pre-hook of a frozen BatchNorm: normalise with its running statistics."""
    module.training = False


def freeze_norm_stats(model: nn.Module) -> None:
    """Keep every BatchNorm without a trainable parameter in eval mode, even under train()."""
    for m in model.modules():
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            if not any(p.requires_grad for p in m.parameters(recurse=False)):
                if _use_running_stats not in m._forward_pre_hooks.values():
                    m.register_forward_pre_hook(_use_running_stats)


def unfreeze_norm_stats(model: nn.Module) -> None:
    for m in model.modules():
        hooks = m._forward_pre_hooks
        for key in [k for k, h in hooks.items() if h is _use_running_stats]:
            del hooks[key]
        if isinstance(m, _BatchNorm):
            m.training = model.training


@dataclass(frozen=True)
class NoOptions:
    """The options of a method that takes none."""

    __pydantic_config__ = FORBID_EXTRA


@dataclass(frozen=True)
class AdapterCounts:
    """Sizes of an adapted model (bytes are ``len(fedcore.payload.encode(...))``)."""

    total_params: int  # every parameter of the adapted model (frozen base + adapters)
    trainable_params: int
    payload_tensors: int
    payload_numel: int  # elements that travel (trainable parameters + trained BN statistics)
    payload_bytes: int  # one upload (or one per-round download) of one client
    model_bytes: int  # the whole adapted state dict (what a client holds)


class AdapterMethod(ABC):
    """One adapter method; subclasses set ``name`` and ``summary``, declare their options
    (``Options``: a frozen dataclass whose annotations carry the allowed values, see
    ``fedcore.options``) and override the hooks."""

    name: ClassVar[str]
    summary: ClassVar[str]
    mergeable: ClassVar[bool] = True
    Options: ClassVar[type[Any]] = NoOptions

    def __init__(self, options: Any = None) -> None:
        """``options``: an instance of ``Options`` (None: its defaults); a mapping goes
        through :meth:`from_options`."""
        if options is None:
            options = self.Options()
        elif not isinstance(options, self.Options):
            raise TypeError(
                f"adapter {self.name!r} takes {self.Options.__name__} options, not "
                f"{type(options).__name__} (a mapping: {type(self).__name__}.from_options)"
            )
        self.options = options

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | object | None = None) -> Self:
        """The method with ``grid.adapter_options[name]``: None (the defaults), a mapping or
        an ``Options`` instance; a bad key or value raises one line naming
        ``grid.adapter_options.<name>.<option>``."""
        return cls(parse(cls.Options, options, f"grid.adapter_options.{cls.name}"))

    def applies_to(self, model: nn.Module) -> str | None:
        """None when the method can adapt ``model``; else the reason (one line)."""
        return None

    @abstractmethod
    def trainable_names(self, model: nn.Module) -> set[str]:
        """Parameter names that train after ``add_modules`` (the rest is the frozen base)."""

    def add_modules(self, model: nn.Module) -> None:
        """Insert the method's own modules (none for full, head and bn_head)."""
        return None

    def inject(self, model: nn.Module) -> nn.Module:
        """Adapt ``model`` in place and freeze its base; returns it."""
        reason = self.applies_to(model)
        if reason is not None:
            raise ConfigError(
                f"adapter {self.name!r} does not apply to {type(model).__name__}: {reason}"
            )
        self.add_modules(model)
        train = self.trainable_names(model)
        for n, p in model.named_parameters():
            p.requires_grad_(n in train)
        freeze_norm_stats(model)
        return model

    # ---- what travels ------------------------------------------------------------------
    def payload_keys(self, model: nn.Module) -> tuple[str, ...]:
        """State-dict keys that travel, in state-dict order (see the module docstring)."""
        keys: set[str] = set()
        for mod_name, mod in model.named_modules():
            own = list(mod.named_parameters(recurse=False))
            trained = [n for n, p in own if p.requires_grad]
            prefix = f"{mod_name}." if mod_name else ""
            keys.update(prefix + n for n in trained)
            if trained and isinstance(mod, _BatchNorm):
                keys.update(
                    prefix + n for n, b in mod.named_buffers(recurse=False) if b is not None
                )
        return tuple(k for k in model.state_dict() if k in keys)

    def trainable_keys(self, model: nn.Module) -> frozenset[str]:
        return frozenset(n for n, p in model.named_parameters() if p.requires_grad)

    def payload(self, model: nn.Module) -> payload.StateDict:
        state = model.state_dict()
        return {k: state[k].detach() for k in self.payload_keys(model)}

    def load_payload(self, model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        """Copy a payload into ``model``; refuses (model unchanged) unless keys, shapes and
        dtypes are exactly those of this method's payload for this model."""
        own = model.state_dict()
        want = self.payload_keys(model)
        missing = [k for k in want if k not in state]
        unexpected = [k for k in state if k not in set(want)]
        wrong = [
            f"{k} {tuple(state[k].shape)}/{state[k].dtype} != {tuple(own[k].shape)}/{own[k].dtype}"
            for k in want
            if k in state and (state[k].shape != own[k].shape or state[k].dtype != own[k].dtype)
        ]
        problems = []
        if missing:
            problems.append(f"missing keys {_names(missing)}")
        if unexpected:
            problems.append(f"unexpected keys {_names(unexpected)}")
        if wrong:
            problems.append(f"mismatching shapes {_names(wrong)}")
        if problems:
            raise ConfigError(
                f"payload refused for adapter {self.name!r} on {type(model).__name__}: "
                + "; ".join(problems)
                + " (the model is unchanged)"
            )
        with torch.no_grad():
            for k in want:
                own[k].copy_(state[k])

    # ---- merge -------------------------------------------------------------------------
    def merge(self, model: nn.Module) -> nn.Module | None:
        """A plain copy of the backbone with the adapters folded in (None: not mergeable).

        Methods without modules of their own merge trivially: the copy drops the frozen-BN
        hooks and makes every parameter trainable again.
        """
        plain = copy.deepcopy(model)
        self.fold(plain)
        unfreeze_norm_stats(plain)
        plain.requires_grad_(True)
        return plain

    def fold(self, model: nn.Module) -> None:
        """Replace the method's modules by plain ones, in place (merge's copy)."""
        return None

    # ---- sizes -------------------------------------------------------------------------
    def counts(self, model: nn.Module) -> AdapterCounts:
        sent = self.payload(model)
        return AdapterCounts(
            total_params=sum(p.numel() for p in model.parameters()),
            trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
            payload_tensors=len(sent),
            payload_numel=sum(t.numel() for t in sent.values()),
            payload_bytes=len(payload.encode(sent)),
            model_bytes=len(payload.encode(model.state_dict())),
        )


def _names(items: Iterable[str], limit: int = 4) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
