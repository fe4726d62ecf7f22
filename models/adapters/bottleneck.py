"""Bottleneck adapters on transformer encoders: ``houlsby``, ``pfeiffer`` and ``parallel``.

A bottleneck adapter maps the hidden state h (width H) through a down-projection to
m = H / reduction_factor, a ReLU and an up-projection back to H. The up-projection starts at
zero, so the adapted model starts equal to the base; the encoder stays frozen and only the
adapters and the classifier train and travel (seed 003 §3 and its Table 12: with the default
reduction factor 16 on ViT-B, Pfeiffer sends 12 x 74,544 parameters = 3.41 MiB, Houlsby
twice that, the seed's 3.41 MB and 6.82 MB).

* ``houlsby`` (Houlsby et al. 2019): a sequential adapter after the attention output
  projection and one after the feed-forward output projection of every block, each with its
  own skip connection (``y + up(relu(down(y)))``), before the block's residual add (and, in
  post-LN BERT, before its LayerNorm).
* ``pfeiffer`` (Pfeiffer et al. 2021, AdapterFusion): one sequential adapter per block, after
  the feed-forward output projection; half of Houlsby's parameters.
* ``parallel`` (He et al. 2021, the PA of seed 001 §5): an adapter beside the feed-forward
  network, fed with the FFN's input and added, scaled by ``scaling`` (4, He et al.), to its
  output. ``exits_pa.py`` adds the same adapter to the early-exit methods (seed 001 "+PA").

Where they attach (one place per backbone family, all reached through the model's
``blocks``: the CLS plumbing of ``models/text.py``, or a decoder's): BERT-style blocks
(``minilm``, ``text_hf``): ``attention.output.dense`` and ``output.dense``, the FFN being
``intermediate`` + ``output``; timm ViT/DeiT blocks (``vit_*``, ``deit_*``): ``attn.proj`` and
``mlp.fc2``, the FFN being ``mlp``; GPT-2 blocks (``gpt2_small``, ``gpt2_hf``, seed 003's
gpt2): ``attn.c_proj`` and ``mlp.c_proj`` (transformers ``Conv1D``, a Linear with its weight
transposed), the FFN being ``mlp``; GPT-2 is pre-LN, so the adapter's output joins the
residual stream directly, as in AdapterHub's GPT-2 Houlsby and Pfeiffer configurations. On a
decoder the tied LM head stays frozen (``models.adapters.base.adapter_head``): only the
adapters train and travel.

Hand-written on purpose: PEFT has no bottleneck adapters (its issue #244), and AdapterHub's
``adapters`` 1.3.0 requires ``transformers~=4.57.6`` (its Requires-Dist), which conflicts with the
transformers 5.23 that fedapt's MiniLM loader uses; it would not cover timm's ViT either.

Merge: none. The ReLU between the projections keeps an adapter from folding into the frozen
linear layers, so the registered model is the base with its adapters, one artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from annotated_types import Ge, Gt
from torch import nn

from fedcore.options import FORBID_EXTRA, Float, Int
from fedcore.protocols import transformer_blocks
from models.adapters.base import AdapterMethod, adapter_head, is_conv1d


class Bottleneck(nn.Module):
    """down (H -> m), ReLU, up (m -> H); up starts at zero (an exact no-op at injection)."""

    def __init__(self, hidden: int, bottleneck: int) -> None:
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        nn.init.normal_(self.down.weight, std=0.01)  # Houlsby et al.: near-identity init
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(self.down(x)))


def out_features(layer: nn.Module) -> int:
    """Output width of an ``nn.Linear`` or a transformers ``Conv1D`` (weight (in, out))."""
    if isinstance(layer, nn.Linear):
        return layer.out_features
    return int(layer.nf)  # type: ignore[arg-type]  # Conv1D, checked by _block_kind


def _is_projection(layer: nn.Module | None) -> bool:
    """An ``nn.Linear``, or GPT-2's ``Conv1D`` (a Linear whose weight is stored transposed)."""
    return isinstance(layer, nn.Linear) or is_conv1d(layer)


class SequentialAdapter(nn.Module):
    """A frozen projection followed by a bottleneck with its own skip: y + adapter(y)."""

    def __init__(self, base: nn.Module, bottleneck: int) -> None:
        super().__init__()
        self.base = base
        self.adapter = Bottleneck(out_features(base), bottleneck)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        return y + self.adapter(y)


class ParallelFFN(nn.Module):
    """A timm ``Mlp`` (or GPT-2's ``GPT2MLP``) with an adapter beside it:
    mlp(x) + scaling * adapter(x)."""

    def __init__(self, base: nn.Module, hidden: int, bottleneck: int, scaling: float) -> None:
        super().__init__()
        self.base = base
        self.adapter = Bottleneck(hidden, bottleneck)
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * self.adapter(x)


class ParallelBertOutput(nn.Module):
    """BERT's FFN output (``BertOutput``) with the parallel adapter: its second input is the
    FFN's input (the attention output), which the adapter reads."""

    def __init__(self, base: nn.Module, hidden: int, bottleneck: int, scaling: float) -> None:
        super().__init__()
        self.base = base
        self.adapter = Bottleneck(hidden, bottleneck)
        self.scaling = scaling

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        b: Any = self.base  # BertOutput: dense, dropout, LayerNorm
        h = b.dropout(b.dense(hidden_states)) + self.scaling * self.adapter(input_tensor)
        return b.LayerNorm(h + input_tensor)


def _block_kind(block: nn.Module) -> str | None:
    """``bert``, ``vit`` or ``gpt2`` by the block's layout, else None."""
    names = dict(block.named_modules())
    if _is_projection(names.get("attn.c_proj")) and _is_projection(names.get("mlp.c_proj")):
        return "gpt2"
    if isinstance(names.get("attention.output.dense"), nn.Linear) and isinstance(
        names.get("output.dense"), nn.Linear
    ):
        return "bert"
    if isinstance(names.get("attn.proj"), nn.Linear) and isinstance(
        names.get("mlp.fc2"), nn.Linear
    ):
        return "vit"
    return None


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = transformer_blocks(model)
    return [] if blocks is None else list(blocks)


def _out_features(module: nn.Module, path: str) -> int:
    return out_features(module.get_submodule(path))  # checked by applies_to (_block_kind)


def _set(parent: nn.Module, path: str, module: nn.Module) -> None:
    owner, _, attr = path.rpartition(".")
    setattr(parent.get_submodule(owner) if owner else parent, attr, module)


def encoder_reason(model: nn.Module) -> str | None:
    """None when every block of ``model`` is one a bottleneck adapter attaches to; else why."""
    blocks = _blocks(model)
    if not blocks:
        return "it is not a transformer encoder or decoder (no blocks with a CLS token)"
    if any(_block_kind(b) is None for b in blocks):
        return (
            "its blocks are neither BERT-style (attention.output.dense, output.dense), "
            "timm ViT-style (attn.proj, mlp.fc2) nor GPT-2 (attn.c_proj, mlp.c_proj)"
        )
    return None


@dataclass(frozen=True)
class BottleneckOptions:
    """``grid.adapter_options.houlsby`` / ``.pfeiffer``. A method with another default
    reduction factor declares a subclass overriding the field's default."""

    __pydantic_config__ = FORBID_EXTRA

    reduction_factor: Annotated[Int, Ge(1)] = 16  # m = H / reduction_factor (seed 003: 16)


@dataclass(frozen=True)
class ParallelOptions(BottleneckOptions):
    """``grid.adapter_options.parallel``."""

    scaling: Annotated[Float, Gt(0)] = 4.0  # He et al.'s s


class BottleneckMethod(AdapterMethod):
    """Shared by the three methods: options, where they apply, what trains."""

    mergeable: ClassVar[bool] = False
    Options: ClassVar[type[Any]] = BottleneckOptions
    options: BottleneckOptions

    @property
    def reduction_factor(self) -> int:
        return self.options.reduction_factor

    def applies_to(self, model: nn.Module) -> str | None:
        return encoder_reason(model)

    def bottleneck(self, hidden: int) -> int:
        return max(1, hidden // self.reduction_factor)

    def trainable_names(self, model: nn.Module) -> set[str]:
        head = adapter_head(model)
        return {
            n
            for n, _ in model.named_parameters()
            if ".adapter." in f".{n}" or (head is not None and n.startswith(f"{head}."))
        }

    def merge(self, model: nn.Module) -> nn.Module | None:
        return None


class Houlsby(BottleneckMethod):
    name: ClassVar[str] = "houlsby"
    summary: ClassVar[str] = "bottleneck adapters after attention and after the FFN (Houlsby)"

    # where the sequential adapters go, per block kind
    sites: ClassVar[dict[str, tuple[str, ...]]] = {
        "bert": ("attention.output.dense", "output.dense"),
        "vit": ("attn.proj", "mlp.fc2"),
        "gpt2": ("attn.c_proj", "mlp.c_proj"),
    }

    def add_modules(self, model: nn.Module) -> None:
        for block in _blocks(model):
            for path in self.sites[_block_kind(block) or "vit"]:
                base = block.get_submodule(path)
                _set(block, path, SequentialAdapter(base, self.bottleneck(out_features(base))))


class Pfeiffer(Houlsby):
    name: ClassVar[str] = "pfeiffer"
    summary: ClassVar[str] = "one bottleneck adapter after the FFN (Pfeiffer)"
    sites: ClassVar[dict[str, tuple[str, ...]]] = {
        "bert": ("output.dense",),
        "vit": ("mlp.fc2",),
        "gpt2": ("mlp.c_proj",),
    }


class Parallel(BottleneckMethod):
    name: ClassVar[str] = "parallel"
    summary: ClassVar[str] = "a bottleneck adapter beside the FFN, scaled (He et al.)"
    Options: ClassVar[type[Any]] = ParallelOptions
    options: ParallelOptions

    @property
    def scaling(self) -> float:
        return self.options.scaling

    def add_modules(self, model: nn.Module) -> None:
        insert_parallel_adapters(model, self.bottleneck, self.scaling)


def insert_parallel_adapters(
    model: nn.Module, bottleneck: Callable[[int], int], scaling: float
) -> None:
    """A parallel adapter beside the FFN of every block (``parallel``, and the exit methods'
    ``+PA`` variants, ``models/adapters/exits_pa.py``); ``bottleneck(H)`` is its width m."""
    for block in _blocks(model):
        if _block_kind(block) == "bert":
            out = block.get_submodule("output")
            hidden = _out_features(block, "output.dense")
            wrapped: nn.Module = ParallelBertOutput(out, hidden, bottleneck(hidden), scaling)
            _set(block, "output", wrapped)
        else:  # timm Mlp, GPT2MLP: one input, the FFN's
            mlp = block.get_submodule("mlp")
            fc2 = "mlp.c_proj" if _block_kind(block) == "gpt2" else "mlp.fc2"
            hidden = _out_features(block, fc2)
            _set(block, "mlp", ParallelFFN(mlp, hidden, bottleneck(hidden), scaling))


def parallel_adapter_names(model: nn.Module) -> set[str]:
    """The parameter names of the parallel adapters in ``model`` (their ``Bottleneck``s)."""
    return {
        f"{path}.adapter.{name}"
        for path, module in model.named_modules()
        if isinstance(module, ParallelFFN | ParallelBertOutput)
        for name, _ in module.adapter.named_parameters()
    }
