"""Early exits on a frozen transformer: the machinery shared by ``lw_linear``, ``lw_mlp`` and
``accumulator`` (seed 001 §4-§5). Hand-written: no library ships these methods.

An exit method adds its modules to the backbone and hooks them onto ``model.blocks`` (the CLS
plumbing of ``models.text``: ``blocks``, ``hidden_size``, ``cls_index``), so it works on
BERT-style encoders (MiniLM) and ViT-style ones (timm ``blocks``) alike:

* a forward hook on block ``l`` reads the CLS state z^l (B, H), may replace it (the
  Accumulator's token replacement, seed 001 eq. 7) and computes the logits of exit ``l``;
* a forward pre-hook on the model decides which exit this call ends at and truncates the block
  list there, so blocks past that exit never run (multi-tier FL: a client never runs blocks past
  its tier); a forward hook on the model restores the blocks and returns the chosen exit's
  logits (B, classes), or every computed exit stacked (E, B, classes) in ``all`` mode.

Which exit: :class:`ExitPlan` (``model.exit_plan``), from the method's options
(``grid.adapter_options.<method>``): ``exits`` is ``last`` (conventional FL: loss at the last
exit), ``anytime`` (an exit drawn uniformly per local step from (seed, round, client, step):
the engine calls ``begin_client(client_id, seed)`` with the client's derived seed) or
``multitier`` (client ``c`` trains at exit ``tiers[c % len(tiers)]``, its fixed maximum, so
tiers are balanced over clients). ``exit`` picks the inference exit (default: the last).
Evaluation reads every exit at once (``fedcore.exits.evaluate_exits``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from annotated_types import Ge
from pydantic import BeforeValidator
from torch import nn

from fedcore.errors import ConfigError
from fedcore.options import FORBID_EXTRA, Int
from fedcore.protocols import cls_blocks, cls_index, hidden_size
from models.adapters.base import AdapterMethod, head_name


@dataclass
class ExitPlan:
    """Which exit a forward call ends at (a plain object on the model, not a module)."""

    num_exits: int
    mode: str = "last"
    tiers: tuple[int, ...] = ()
    exit: int | None = None  # inference exit (None: the last)
    output: str = "one"  # "one": (B, C) of the chosen exit; "all": (E, B, C) up to it
    blocks_path: str = ""
    # per-client state (set by begin_client)
    seed: int = 0
    tier: int | None = None
    step: int = 0
    # set by the cohort engine: the exit every training call ends at (clients grouped by exit)
    forced: int | None = None
    # per-call state
    _stop: int = 0
    _cls: list[torch.Tensor] = field(default_factory=list)
    _logits: list[torch.Tensor] = field(default_factory=list)
    _saved: Any = None

    def begin_client(self, client_id: int, seed: int) -> None:
        """A client's local training starts: its tier and its anytime stream."""
        self.seed, self.step = int(seed), 0
        self.tier = self.tiers[client_id % len(self.tiers)] if self.mode == "multitier" else None

    def train_exit(self) -> int:
        """The exit of the next local step (deterministic from (seed, round, client, step))."""
        last = self.num_exits - 1
        if self.mode == "multitier":
            return last if self.tier is None else self.tier
        if self.mode == "anytime":
            rng = np.random.default_rng([self.seed, self.step])
            return int(rng.integers(self.num_exits))
        return last

    def client_exits(self, client_id: int, seed: int, steps: int) -> list[int]:
        """The exits of a client's ``steps`` local steps: what ``begin_client`` followed by
        ``steps`` training calls would pick (the cohort engine groups clients by them)."""
        saved = (self.seed, self.step, self.tier)
        try:
            self.begin_client(client_id, seed)
            out = []
            for _ in range(steps):
                out.append(self.train_exit())
                self.step += 1
            return out
        finally:
            self.seed, self.step, self.tier = saved

    def stop_exit(self, training: bool) -> int:
        if training and self.forced is not None:
            return self.forced
        if training:
            k = self.train_exit()
            self.step += 1
            return k
        return self.num_exits - 1 if self.exit is None else self.exit


def _no_tiers(value: Any) -> Any:
    """``tiers: null`` is no tiers."""
    return () if value is None else value


@dataclass(frozen=True)
class ExitOptions:
    """``grid.adapter_options.<method>`` of an early-exit method. Checks that need the
    model's depth (an exit or tier beyond it) come at injection: :meth:`ExitMethod.check_depth`."""

    __pydantic_config__ = FORBID_EXTRA

    exits: Literal["last", "anytime", "multitier"] = "last"  # training exits (module docstring)
    tiers: Annotated[tuple[Annotated[Int, Ge(0)], ...], BeforeValidator(_no_tiers)] = ()
    exit: Annotated[Int, Ge(0)] | None = None  # inference exit (None: the last)

    def __post_init__(self) -> None:
        if self.exits == "multitier" and not self.tiers:
            raise ValueError("exits: multitier needs tiers (e.g. [1, 3, 5])")
        if self.exits != "multitier" and self.tiers:
            raise ValueError("tiers are only used with exits: multitier")


def block_container(model: nn.Module) -> tuple[str, nn.Module]:
    """(module path, module) of ``model.blocks`` inside ``model``."""
    blocks = cls_blocks(model)
    for path, module in model.named_modules():
        if module is blocks and path:
            return path, model.get_submodule(path)
    raise ConfigError(f"{type(model).__name__} has no ``blocks`` list of transformer blocks")


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    parent._modules[name] = module


class ExitMethod(AdapterMethod):
    """Base of the early-exit methods: options, hooks, frozen base, no merge."""

    mergeable = False
    Options: ClassVar[type[Any]] = ExitOptions
    options: ExitOptions

    def applies_to(self, model: nn.Module) -> str | None:
        if cls_blocks(model) is None:
            return "it is not a transformer with CLS plumbing (blocks, cls_index)"
        if head_name(model) is None:
            return "it has no nn.Linear classifier"
        return None

    # ---- what a method defines ---------------------------------------------------------
    def build(self, model: nn.Module, hidden: int, num_classes: int, depth: int) -> None:
        """Add the method's modules to ``model``."""
        raise NotImplementedError

    def on_block(
        self, model: nn.Module, index: int, z: torch.Tensor, history: list[torch.Tensor]
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(replacement CLS (B, H) or None, exit logits (B, classes)) after block ``index``."""
        raise NotImplementedError

    # ---- the contract ------------------------------------------------------------------
    def check_depth(self, depth: int) -> None:
        o = self.options
        for what, k in [("exit", o.exit), *[("tier", t) for t in o.tiers]]:
            if k is not None and k >= depth:
                raise ConfigError(
                    f"adapter {self.name!r}: {what} {k} is beyond the model's exits "
                    f"0..{depth - 1} ({depth} blocks)"
                )

    def add_modules(self, model: nn.Module) -> None:
        depth = len(model.blocks)  # type: ignore[arg-type]
        self.check_depth(depth)
        head = model.get_submodule(head_name(model) or "")
        assert isinstance(head, nn.Linear)
        hidden = hidden_size(model, head.in_features)
        self.build(model, hidden, head.out_features, depth)
        path, _ = block_container(model)
        o = self.options
        model.exit_plan = ExitPlan(  # type: ignore[assignment]
            num_exits=depth, mode=o.exits, tiers=o.tiers, exit=o.exit, blocks_path=path
        )
        model.exit_method = self  # type: ignore[assignment]
        for i, block in enumerate(model.blocks):  # type: ignore[arg-type]
            block.register_forward_hook(partial(_after_block, i))
        model.register_forward_pre_hook(_begin)
        model.register_forward_hook(_end, always_call=True)

    def merge(self, model: nn.Module) -> nn.Module | None:
        """None: exit heads read every block; the registered model is the adapted one."""
        return None


# The hooks are module-level functions (picklable, and a deep copy of the model uses its own
# plan): the model being run is the top of ``_ACTIVE`` while its blocks run.
_ACTIVE: list[nn.Module] = []


def active_model() -> nn.Module:
    """The model whose blocks are running (the top of the stack of models in a forward)."""
    return _ACTIVE[-1]


def _begin(model: nn.Module, args: Any) -> None:
    plan: ExitPlan = model.exit_plan  # type: ignore[assignment]
    plan._stop = plan.stop_exit(model.training)
    plan._cls, plan._logits = [], []
    blocks = model.get_submodule(plan.blocks_path)
    plan._saved = blocks
    if plan._stop < len(blocks):  # type: ignore[arg-type]
        kept = list(blocks)[: plan._stop + 1]  # type: ignore[call-overload]
        short = nn.Sequential(*kept) if isinstance(blocks, nn.Sequential) else nn.ModuleList(kept)
        _set_submodule(model, plan.blocks_path, short)
    _ACTIVE.append(model)


def _end(model: nn.Module, args: Any, out: Any) -> Any:
    plan: ExitPlan = model.exit_plan  # type: ignore[assignment]
    if _ACTIVE and _ACTIVE[-1] is model:
        _ACTIVE.pop()
    if plan._saved is not None:
        _set_submodule(model, plan.blocks_path, plan._saved)
        plan._saved = None
    if not plan._logits:
        return out  # an exception inside forward: nothing to return
    logits, plan._logits, plan._cls = plan._logits, [], []
    return torch.stack(logits) if plan.output == "all" else logits[-1]


def _after_block(index: int, block: nn.Module, args: Any, out: Any) -> Any:
    model = _ACTIVE[-1]
    plan: ExitPlan = model.exit_plan  # type: ignore[assignment]
    method: ExitMethod = model.exit_method  # type: ignore[assignment]
    cls = cls_index(model)
    hidden_states = out[0] if isinstance(out, tuple) else out  # (B, T, H)
    z = hidden_states[:, cls]  # (B, H)
    plan._cls.append(z)
    new_cls, logits = method.on_block(model, index, z, plan._cls)
    plan._logits.append(logits)
    if new_cls is None:
        return None
    replaced = torch.cat(
        [hidden_states[:, :cls], new_cls.unsqueeze(1), hidden_states[:, cls + 1 :]], dim=1
    )
    return (replaced, *out[1:]) if isinstance(out, tuple) else replaced
