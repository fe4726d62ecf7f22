"""``accumulator_pa``, ``lw_linear_pa``, ``lw_mlp_pa``: the early-exit methods trained together
with parallel adapters in the FFN of the frozen transformer (seed 001 §5: "We also compare the
variants of L.W. Linear, MLP, and Accumulator with Parallel Adapters (PA), as proposed in He et
al. (2021), injected into the feed-forward MLP networks"; the "+ PA" rows of Tables 1-3, the
"+Adapter" columns of Table 6). Hand-written, like the methods it combines.

Each method is its exit method (``accumulator``, ``lw_linear``, ``lw_mlp``: same modules, same
hooks, same exits ``last`` / ``anytime`` / ``multitier``) plus ``parallel``'s adapter beside the
FFN of every block (``models/adapters/bottleneck.py``: FFN(x) + scaling * up(relu(down(x))),
``up`` zero-initialised, so at injection the logits are the plain exit method's). What trains
and travels is the union: the exit modules and the adapters; the rest of the encoder and its
classifier stay frozen. No merge (as for both parts).

Options: the exit method's (``grid.adapter_options.<method>``) plus the adapters':

* ``bottleneck`` (default 64): the adapter's width m, absolute as in He et al. Seed 001 Table 5
  gives the PA 0.60M parameters on DeiT-S (12 blocks, H = 384); one adapter has
  2 H m + m + H parameters (down and up with biases), so m = 64 gives 12 x 49,600 = 595,200
  (0.60M; m = 65 would give 604,428, also 0.60M: 64 is the round width, H / 6). Table 6 agrees:
  every "+Adapter" column adds 0.60M to the plain method's size (0.46 -> 1.06, 3.17 -> 3.77).
* ``scaling`` (default 4.0): He et al.'s s for the FFN's parallel adapter.

With the adapters in the encoder, the CLS state after block ``k`` depends on trained parameters,
so these methods do not declare ``exit_head_path`` (``fedcore.protocols.exit_heads``): the cohort
engine recomputes the encoder every step instead of caching its CLS history, and
``runtime.engine: auto`` runs them on the sequential engine, as it does ``accumulator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt
from torch import nn

from fedcore.options import FORBID_EXTRA, Float, Int
from models.adapters.accumulator import AccumulatorMethod, AccumulatorOptions
from models.adapters.bottleneck import (
    encoder_reason,
    insert_parallel_adapters,
    parallel_adapter_names,
)
from models.adapters.exits import ExitMethod, ExitOptions
from models.adapters.lw_linear import LayerwiseLinear
from models.adapters.lw_mlp import LayerwiseMLP, LayerwiseMLPOptions

# Seed 001 Table 5: "Parallel Adapter 0.60M" on DeiT-S = 12 x (2 x 384 x 64 + 64 + 384).
PA_BOTTLENECK = 64


@dataclass(frozen=True)
class PAOptions:
    """The parallel adapters' options of a ``+PA`` method (mixed into its exit options)."""

    __pydantic_config__ = FORBID_EXTRA

    bottleneck: Annotated[Int, Ge(1)] = PA_BOTTLENECK  # the adapter width m
    scaling: Annotated[Float, Gt(0)] = 4.0  # He et al.'s s


@dataclass(frozen=True)
class LayerwisePAOptions(PAOptions, ExitOptions):
    """``grid.adapter_options.lw_linear_pa``: exits, tiers, exit, bottleneck, scaling."""


@dataclass(frozen=True)
class LayerwiseMLPPAOptions(PAOptions, LayerwiseMLPOptions):
    """``grid.adapter_options.lw_mlp_pa``: exits, tiers, exit, mlp_ratio, bottleneck,
    scaling."""


@dataclass(frozen=True)
class AccumulatorPAOptions(PAOptions, AccumulatorOptions):
    """``grid.adapter_options.accumulator_pa``: the Accumulator's options plus bottleneck,
    scaling."""


class WithParallelAdapters(ExitMethod):
    """Mixed in before an exit method: adds the parallel adapters and trains them too."""

    options: Any  # an exit method's options with PAOptions mixed in

    def applies_to(self, model: nn.Module) -> str | None:
        return super().applies_to(model) or encoder_reason(model)

    def add_modules(self, model: nn.Module) -> None:
        super().add_modules(model)  # the exit modules and hooks (on the blocks, not inside)
        insert_parallel_adapters(
            model, lambda _hidden: self.options.bottleneck, self.options.scaling
        )

    def trainable_names(self, model: nn.Module) -> set[str]:
        # super(): the exit method after this mixin in the MRO (it defines the method)
        exits = super().trainable_names(model)  # type: ignore[safe-super]
        return exits | parallel_adapter_names(model)

    # The CLS states depend on the trained adapters: no cacheable exit heads (module docstring).
    # ``fedcore.protocols.exit_heads`` reads a non-callable ``exit_head_path`` as undeclared;
    # the subclasses of ``LayerwiseLinear`` below retract its declaration (type: ignore[misc]).
    exit_head_path = None


class AccumulatorPA(WithParallelAdapters, AccumulatorMethod):
    name = "accumulator_pa"
    summary = "the Accumulator plus parallel adapters beside every FFN (seed 001 +PA)"
    Options: ClassVar[type[Any]] = AccumulatorPAOptions


class LayerwiseLinearPA(WithParallelAdapters, LayerwiseLinear):  # type: ignore[misc]
    name = "lw_linear_pa"
    summary = "layer-wise linear exits plus parallel adapters beside every FFN (seed 001 +PA)"
    Options: ClassVar[type[Any]] = LayerwisePAOptions


class LayerwiseMLPPA(WithParallelAdapters, LayerwiseMLP):  # type: ignore[misc]
    name = "lw_mlp_pa"
    summary = "layer-wise MLP exits plus parallel adapters beside every FFN (seed 001 +PA)"
    Options: ClassVar[type[Any]] = LayerwiseMLPPAOptions
