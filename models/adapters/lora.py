"""``lora``: low-rank adapters through HF PEFT (Hu et al. 2021; seed 003 §3, LoRA in FL).

A target layer with frozen weight W computes W x + (alpha / r) B A x, with A: r x d_in
(Kaiming-uniform) and B: d_out x r (zeros), so the adapted model starts equal to the base and
only A and B train. PEFT's own layers do the work (``peft.inject_adapter_in_model``); fedapt
picks the targets, freezes the base through the shared contract and merges with PEFT's merge.

Where LoRA goes (``target_modules`` option; by default, per backbone):

* transformer encoders (``blocks`` with the CLS plumbing of ``models/text.py``: the BERT-style
  ``minilm`` / ``text_hf`` and the timm ``vit_*`` / ``deit_*`` models): the attention's
  ``query`` and ``value`` projections of every block, as the LoRA paper and seed 003 do
  (fedapt's ViT exposes timm's fused ``qkv`` as
  ``query`` / ``key`` / ``value`` Linears: ``models/vit.py``); the classifier trains too;
* GPT-2 decoders (``gpt2_small``, ``gpt2_hf``): the fused query/key/value projection
  ``attn.c_attn`` of every block (a transformers ``Conv1D``, adapted by PEFT with
  ``fan_in_fan_out``; PEFT's own default for GPT-2), so B A also updates the keys, which the
  fused layer does not let LoRA leave out; the tied LM head stays frozen (only A and B
  travel: ``models.adapters.base.adapter_head``);
* CNNs built from depthwise-separable blocks (a depthwise conv present: EfficientNet-Lite0): the
  pointwise 1x1 convolutions, which hold the weights (``models/efficientnet.py``: 93% of
  Lite0's, 22,784 LoRA parameters per unit of rank); other CNNs (ResNets, the seeds' CNNs):
  every dense ``nn.Conv2d`` (PEFT's conv LoRA: A has the conv's kernel, B is 1x1); in both
  BatchNorm (parameters and statistics) and the classifier train, as in seed 000.

A 1x1 conv never pads, so LoRA's A conv lines up with EfficientNet's TensorFlow-style
``Conv2dDynamicSamePadding`` (padding computed in ``forward``); larger kernels of such
subclasses are not targeted by default.

Payload: exactly the A/B matrices, the classifier and the trained BatchNorm layers (with their
statistics). Aggregation: the engine averages A and B separately (as seed 003 does), which is
not the average of the clients' updates B A; :func:`lora_delta` gives each layer's
(alpha / r) B A so that an algorithm can aggregate the product instead.

Merge: PEFT's ``merge`` folds (alpha / r) B A into W, and each wrapped layer is replaced by its
base layer: a plain model of the backbone's own class with the state-dict keys of the base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from annotated_types import Ge, Gt, Lt, MinLen
from pydantic import BeforeValidator
from torch import nn

from fedcore.errors import ConfigError
from fedcore.options import FORBID_EXTRA, Float, Int
from fedcore.protocols import transformer_blocks
from models.adapters.base import AdapterMethod, head_name, is_conv1d
from models.adapters.bn_head import bn_and_head

ADAPTER = "default"  # PEFT's adapter name: keys ``<layer>.lora_A.default.weight``
ATTENTION_TARGETS = ("query", "value")
DECODER_TARGETS = ("c_attn",)  # GPT-2's fused query/key/value Conv1D
_TARGET_TYPES = (nn.Linear, nn.Conv2d)


def _targetable(m: nn.Module) -> bool:
    return isinstance(m, _TARGET_TYPES) or is_conv1d(m)


def _module_names(value: Any) -> Any:
    """``target_modules``: a name alone is a list of one; an empty list names nothing."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and not value:
        raise ValueError(f"must be a list of module names, e.g. [query, value] (got {value!r})")
    return value


@dataclass(frozen=True)
class LoraOptions:
    """``grid.adapter_options.lora``."""

    __pydantic_config__ = FORBID_EXTRA

    r: Annotated[Int, Ge(1)] = 8  # rank
    alpha: Annotated[Float, Gt(0)] = 16.0  # scaling alpha / r
    dropout: Annotated[Float, Ge(0), Lt(1)] = 0.0  # on the adapter's input; off: deterministic
    # names or name suffixes (a name alone: a list of one); None: per backbone
    target_modules: Annotated[
        tuple[Annotated[str, MinLen(1)], ...] | None, BeforeValidator(_module_names)
    ] = None


def is_transformer(model: nn.Module) -> bool:
    """An encoder classifier with the CLS plumbing of ``models/text.py`` (``blocks``,
    ``hidden_size``, ``cls_index``) or a decoder (``models/decoder.py``); a CNN may have
    ``blocks`` too (ResNet26's stages)."""
    return transformer_blocks(model) is not None


def _pointwise(m: nn.Module) -> bool:
    return isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) and m.groups == 1


def _depthwise(m: nn.Module) -> bool:
    return isinstance(m, nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels


def default_targets(model: nn.Module) -> list[str]:
    """Full module names LoRA adapts when ``target_modules`` is not given (module docstring)."""
    head = head_name(model)
    modules = [(n, m) for n, m in model.named_modules() if n and n != head]
    if is_transformer(model):
        return [
            n
            for n, m in modules
            if (isinstance(m, nn.Linear) and n.rpartition(".")[2] in ATTENTION_TARGETS)
            or (is_conv1d(m) and n.rpartition(".")[2] in DECODER_TARGETS)
        ]
    if any(_depthwise(m) for _, m in modules):  # depthwise-separable: the 1x1 convs
        return [n for n, m in modules if _pointwise(m)]
    return [n for n, m in modules if _pointwise(m) or (type(m) is nn.Conv2d and m.groups == 1)]


def available_names(model: nn.Module) -> list[str]:
    """Short names of the Linear / Conv2d layers LoRA could target (for error messages)."""
    head = head_name(model)
    return sorted(
        {
            n.rpartition(".")[2]
            for n, m in model.named_modules()
            if n and n != head and _targetable(m)
        }
    )


def resolve_targets(model: nn.Module, targets: tuple[str, ...] | None) -> list[str]:
    """Full module names for ``targets`` (each a full name or a dotted suffix, PEFT's rule)."""
    if targets is None:
        return default_targets(model)
    head = head_name(model)
    found: list[str] = []
    for t in targets:
        hits = [
            n
            for n, m in model.named_modules()
            if n and (n == t or n.endswith("." + t)) and _targetable(m)
        ]
        if not hits or hits == [head]:
            raise ConfigError(
                f"lora target module {t!r} not found in {type(model).__name__} (LoRA adapts "
                f"nn.Linear / nn.Conv2d layers, not the classifier); available: "
                f"{', '.join(available_names(model))}"
            )
        found += [n for n in hits if n != head and n not in found]
    return found


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}  # type: ignore[misc]


def lora_delta(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each adapted layer's weight update (alpha / r) B A, shaped like its weight."""
    with torch.no_grad():
        return {
            f"{n}.weight": m.get_delta_weight(ADAPTER).detach()  # type: ignore[operator]
            for n, m in lora_layers(model).items()
        }


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _plain_conv(model: nn.Module, name: str) -> None:
    """A targeted ``nn.Conv2d`` subclass becomes a plain ``nn.Conv2d`` with the same tensors.

    PEFT builds A and B with the target's own class and conv signature; EfficientNet's
    ``Conv2dDynamicSamePadding`` has another signature and pads in ``forward``. A 1x1 conv
    never pads (TF "same" padding of a 1x1 kernel is 0 at any stride), so the plain conv
    computes exactly the same; larger kernels of such subclasses are refused."""
    m = model.get_submodule(name)
    if not isinstance(m, nn.Conv2d) or type(m) is nn.Conv2d:
        return
    if tuple(m.kernel_size) != (1, 1) or tuple(m.dilation) != (1, 1):
        raise ConfigError(
            f"lora target module {name!r} is a {type(m).__name__} {m.kernel_size} that pads in "
            f"forward; LoRA's convs would not line up with it: target 1x1 convs"
        )
    conv = nn.Conv2d(
        m.in_channels,
        m.out_channels,
        1,
        stride=tuple(m.stride),  # type: ignore[arg-type]
        groups=m.groups,
        bias=m.bias is not None,
        device="meta",
    )
    conv.weight, conv.bias = m.weight, m.bias
    conv.train(m.training)
    _replace(model, name, conv)


class Lora(AdapterMethod):
    name = "lora"
    summary = "LoRA (PEFT): low-rank B A beside the attention query/value (CNNs: the convs)"
    Options: ClassVar[type[Any]] = LoraOptions
    options: LoraOptions

    def applies_to(self, model: nn.Module) -> str | None:
        if head_name(model) is None:
            return "it has no nn.Linear classifier"
        if self.options.target_modules is None and not default_targets(model):
            return (
                "it has no attention query/value nn.Linear (transformer), no c_attn (GPT-2) "
                "and no dense nn.Conv2d (CNN); name layers in "
                "grid.adapter_options.lora.target_modules"
            )
        return None

    def add_modules(self, model: nn.Module) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        o = self.options
        targets = resolve_targets(model, o.target_modules)
        conv1d = [is_conv1d(model.get_submodule(n)) for n in targets]
        if any(conv1d) and not all(conv1d):  # PEFT's fan_in_fan_out is one flag for all
            raise ConfigError(
                "grid.adapter_options.lora.target_modules: mixes transformers Conv1D layers "
                "(weight stored transposed) with other layers; target one kind"
            )
        config = LoraConfig(
            fan_in_fan_out=any(conv1d),  # Conv1D keeps W as (in, out): B A is transposed
            r=o.r,
            lora_alpha=o.alpha,  # type: ignore[arg-type]  # any number: scaling = alpha / r
            lora_dropout=o.dropout,
            target_modules=targets,  # full names: matched exactly
            bias="none",
            init_lora_weights=True,  # A Kaiming-uniform, B zeros: starts equal to the base
        )
        for name in targets:
            _plain_conv(model, name)
        try:
            inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        except (ValueError, TypeError) as exc:  # e.g. a layer type PEFT cannot wrap
            raise ConfigError(
                f"lora on {type(model).__name__}: {str(exc).splitlines()[0][:200]}"
            ) from None

    def trainable_names(self, model: nn.Module) -> set[str]:
        lora = {n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}
        return lora | bn_and_head(model)

    def fold(self, model: nn.Module) -> None:
        for name, m in lora_layers(model).items():
            m.merge(safe_merge=True)  # type: ignore[operator]  # W += (alpha / r) B A
            _replace(model, name, m.get_base_layer())  # type: ignore[operator]
        if "peft_config" in vars(model):
            del model.peft_config
