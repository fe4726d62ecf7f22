"""Cohort execution: the clients of a round train together, one batched computation per step.

The sequential engine (``fedcore.engine`` with ``engine="sequential"``) trains one client at a
time; it stays the reference. Here the clients of a round (a *cohort*) train at once:

* every client's trainable parameters, changing buffers (BatchNorm running statistics) and
  optimiser state are stacked along a leading client dimension;
* one local step of all clients is one call of ``torch.func.vmap`` over
  ``grad(functional_call(model, ...))``: each client sees exactly its own batch, drawn from its
  own generator in its own order (``fedcore.client.batch_order``), with its own objective;
* frozen parameters are *not* stacked: every client holds the same values (the global model it
  downloaded), so vmap runs a frozen layer once over all clients' samples as one large batch and
  never computes its weight gradient (the shared frozen base of adapter methods);
* ragged clients are grouped, never padded: at step ``s`` the clients still training are
  grouped by batch size, input shape and early exit, and each group is one vmapped call. A
  client with fewer steps simply stops; a short last batch trains with its own size. What a
  client computes is what it computes in ``fedcore.client.train_locally``.

The SGD and AdamW updates are the arithmetic of ``torch.optim.sgd``/``torch.optim.adam``
(single-tensor path) applied to the stacked tensors, element by element. A parameter that gets
no gradient in a step (an early exit's unused head) is skipped for the clients of that step,
as ``torch.optim`` skips a parameter whose ``.grad`` is None: no weight decay, no momentum.

Which parameters a step uses, and which buffers it changes, is found once per step shape by a
probe (one client's step with ``torch.autograd``), and cached.

Hand-written: no FL framework vectorises clients (Flower, FedML, pfl-research and FedScale run
them one after another or one per process); ``torch.func`` supplies the batching.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedcore.client import (
    OPTIMIZERS,
    LocalConfig,
    LocalResult,
    Objective,
    ObjectiveFn,
    batch_order,
    split_state,
)
from fedcore.errors import ConfigError
from fedcore.payload import StateDict
from fedcore.protocols import cls_index, exit_heads, exit_plan

ENGINES = ("auto", "cohort", "sequential")


@dataclass(frozen=True)
class CohortClient:
    """One client of a cohort: what ``train_locally`` gets besides the shared arguments."""

    client_id: int
    indices: np.ndarray
    seed: int
    noise_var: float = 0.0


def resolve_engine(
    name: str,
    device: str,
    model: nn.Module | None = None,
    trainable: frozenset[str] | None = None,
    noise_var: Sequence[float] = (),
) -> str:
    """``runtime.engine`` -> "cohort" or "sequential".

    auto follows the measurements (docs/performance.md): on CPU the cohort engine is faster
    where it caches the frozen part's output: the trained part is one module behind a frozen,
    noise-free path (``head``: 36x per W1 round) or the exit heads of ``lw_linear``/``lw_mlp``
    on a frozen encoder. It is slower where per-client weights run through convolutions
    (``full``, ``lora``, ``residual``: grouped convolutions, larger working sets, layout
    copies). CUDA has not been measured yet, so auto decides the same way there.
    """
    if name not in ENGINES:
        raise ConfigError(f"runtime.engine must be one of {', '.join(ENGINES)} (got {name!r})")
    if name != "auto":
        return name
    if model is None or not trainable or any(v > 0 for v in noise_var):
        return "sequential"
    try:
        check_batchable(model)
    except ConfigError:
        return "sequential"
    if exit_plan(model) is not None:  # cached CLS history: lw_linear, lw_mlp
        return "cohort" if exit_heads(model) is not None else "sequential"
    return "cohort" if _common_module(sorted(trainable)) else "sequential"


def check_batchable(model: nn.Module) -> None:
    """The one-line ConfigError for a model the cohort engine cannot batch: random layers in
    training (dropout with p > 0 draws from the global generator, one stream for all clients,
    which a vmapped step cannot reproduce per client)."""
    random = [
        name or type(model).__name__
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
    ]
    if random:
        raise ConfigError(
            f"runtime.engine: cohort cannot batch random layers ({', '.join(random[:3])}: "
            "dropout p > 0); set their dropout to 0 or use runtime.engine: sequential"
        )


def shared_objective(algorithm_name: str, objectives: Sequence[Any]) -> tuple[ObjectiveFn, list]:
    """(the function all clients share, their ctx dicts), or the one-line ConfigError."""
    first = objectives[0]
    if all(isinstance(o, Objective) for o in objectives):
        keys = set(first.ctx)
        if any(set(o.ctx) != keys for o in objectives):
            raise ConfigError(
                f"runtime.engine: cohort: {algorithm_name}'s client objectives carry different "
                "tensors per client; use runtime.engine: sequential"
            )
        return first.fn, [dict(o.ctx) for o in objectives]
    if all(o is first for o in objectives):  # one plain function for every client
        return (lambda logits, y, params, ctx: first(logits, y, params)), [{} for _ in objectives]
    raise ConfigError(
        f"runtime.engine: cohort cannot batch {algorithm_name}: its client_objective returns a "
        "different plain function per client (return fedcore.cohort.Objective, with per-client "
        "tensors in ctx); use runtime.engine: sequential"
    )


# ---- memory --------------------------------------------------------------------------------


def available_memory(device: str) -> int:
    """Bytes free for a cohort on ``device`` (CUDA: free device memory; CPU: MemAvailable)."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a dependency of the pinned set
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def activation_bytes(model: nn.Module, state: StateDict, x: torch.Tensor) -> int:
    """Bytes of every module output of one forward pass on ``x`` (what backward keeps)."""
    total = 0

    def hook(_m: nn.Module, _a: Any, out: Any) -> None:
        nonlocal total
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            params, buffers = split_state(model, state)
            functional_call(model, (params, {k: v.clone() for k, v in buffers.items()}), (x,))
    finally:
        for h in handles:
            h.remove()
    return total


# ---- cached frozen features ----------------------------------------------------------------


def _under(d: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``d`` under module ``prefix`` ("fc3."), named relative to it."""
    if not prefix:
        return dict(d)
    n = len(prefix)
    return {k[n:]: v for k, v in d.items() if k.startswith(prefix)}


def _unchanged(frozen: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor]) -> bool:
    """The frozen tensors still hold the values a cache was computed from."""
    return all(
        frozen[k] is ref
        or (frozen[k].data_ptr() == ref.data_ptr() and frozen[k]._version == ref._version)
        or torch.equal(frozen[k], ref)
        for k, ref in refs.items()
    )


def _params(work: StateDict, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    return {k: work[k] for k in keys}


def _common_module(keys: Sequence[str]) -> str:
    """The deepest module holding every key ("" when it is the model itself)."""
    parts = [k.split(".")[:-1] for k in keys]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


@dataclass
class FeatureCache:
    """What the frozen part of the model computes for a sample: the input of the trained
    module, computed once per sample and reused every step, client and round.

    Valid while the frozen tensors are unchanged (``frozen_refs``: the tensors it was computed
    from; a different tensor with other values drops the cache) and the input path has no
    randomness (no Gaussian feature noise; checked by the caller). Memory: one row per training
    sample, allocated when the cache is planned and bounded by ``FEATURE_CACHE_SHARE`` of the
    free memory; a larger cache is not built and the frozen part is recomputed every step.
    """

    module: nn.Module  # the trained module (its input is cached)
    prefix: str  # its path in the model, with a trailing dot
    store: torch.Tensor  # (N, *feature shape): rows of the training set
    have: torch.Tensor  # (N,) bool: rows computed
    labels: torch.Tensor  # (N,) the training labels on the device
    frozen_refs: dict[str, torch.Tensor]
    fill: Callable[[torch.Tensor], torch.Tensor]  # sample rows -> their features

    def ensure(self, rows: torch.Tensor, chunk: int = 256) -> None:
        rows = rows.to(self.have.device)
        missing = rows[~self.have[rows]].unique()
        if not len(missing):
            return
        for part in missing.split(chunk):
            self.store[part.to(self.store.device)] = self.fill(part)
            self.have[part] = True

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = rows.to(self.store.device)
        return self.store.index_select(0, rows), self.labels.index_select(0, rows)


FEATURE_CACHE_SHARE = 0.25  # of the free memory, at most, for cached features


# ---- the cohort trainer --------------------------------------------------------------------


@dataclass
class _Probe:
    used: tuple[str, ...]  # trainable parameters that get a gradient
    changing: frozenset[str]  # buffers a training forward pass changes


class CohortTrainer:
    """Trains cohorts of clients of one model; keeps what it learns about the model (probes)
    across rounds. One per Simulation."""

    def __init__(self, model: nn.Module, *, device: str = "cpu", max_clients: int | None = None):
        self.model = model
        self.device = device
        self.max_clients = max_clients  # None: decided from memory on the first cohort
        self._probes: dict[tuple, _Probe] = {}
        self._sizes: dict[tuple, int] = {}
        self._caches: dict[tuple, FeatureCache | None] = {}
        self.peak_clients = 0  # the largest cohort trained

    # -- memory --------------------------------------------------------------------------
    def cohort_size(
        self,
        state: StateDict,
        data: Any,
        clients: Sequence[CohortClient],
        cfg: LocalConfig,
        trainable: frozenset[str] | None,
    ) -> int:
        """Clients per cohort: ``max_clients`` if set, else as many as half the free memory
        holds (per client: trainable parameters x their copies, plus one step's activations).

        Raises the one-line ConfigError when not even one client fits."""
        params, buffers = split_state(self.model, state)
        train = [v for k, v in params.items() if trainable is None or k in trainable]
        # parameter, gradient, the update's temporaries, momentum (AdamW: two moments)
        copies = 6 if cfg.optimizer == "adamw" else 5
        per_client = copies * sum(t.numel() * t.element_size() for t in train)
        per_client += 2 * sum(t.numel() * t.element_size() for t in buffers.values())
        key = ("activations", tuple(sorted(trainable)) if trainable is not None else None)
        act = self._sizes.get(key)
        if act is None:
            shard = torch.as_tensor(clients[0].indices[:1], dtype=torch.int64)
            x, _ = data.batch(shard, device=self.device)
            act = activation_bytes(self.model, {k: v.to(self.device) for k, v in state.items()}, x)
            self._sizes[key] = act
        # forward outputs kept for backward, their gradients, and the batch itself: x 3
        per_client += 3 * act * cfg.batch_size
        budget = available_memory(self.device) // 2
        if per_client > budget:
            raise ConfigError(
                f"runtime.engine: cohort: one client needs about {per_client / 2**20:.0f} MiB "
                f"and {budget / 2**20:.0f} MiB is available (half the free memory); use "
                "runtime.engine: sequential or a smaller client.batch_size"
            )
        fits = max(1, budget // per_client)
        size = fits if self.max_clients is None else min(self.max_clients, fits)
        self.peak_clients = max(self.peak_clients, min(size, len(clients)))
        return int(size)

    # -- cached features -----------------------------------------------------------------
    def _feature_cache(
        self,
        work: StateDict,
        train_keys: Sequence[str],
        frozen: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        data: Any,
        shards: Sequence[torch.Tensor],
        training: bool = True,
    ) -> FeatureCache | None:
        """The cache for this model and trained part, built on first use (None: the frozen
        part cannot be cached, see :class:`FeatureCache`). ``training``: features as the
        training forward pass computes them, else as evaluation (``model.eval()``) does."""
        if not train_keys or not hasattr(data, "labels") or not len(shards):
            return None
        path = _common_module(train_keys)
        if not path:
            return None
        key = (id(data), tuple(train_keys), training)
        if key in self._caches and self._caches[key] is None:
            return None  # found not cacheable for this model, trained part and data
        cache = self._caches.get(key)
        if cache is not None and _unchanged(frozen, cache.frozen_refs):
            rows = torch.cat(list(shards)) if shards else torch.zeros(0, dtype=torch.int64)
            cache.ensure(rows)
            return cache
        self._caches.pop(key, None)
        module = self.model.get_submodule(path)
        prefix = path + "."

        def frozen_forward(rows: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
            """(the trained module's input, whether the model is exactly module(input))."""
            seen: list[tuple[Any, Any]] = []

            def pre(_m: nn.Module, args: Any, kwargs: Any) -> None:
                seen.append((args, kwargs))

            def post(_m: nn.Module, _a: Any, out: Any) -> None:
                seen.append(("out", out))

            h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
            h2 = module.register_forward_hook(post)
            mode = self.model.training
            self.model.train(training)
            try:
                x, _ = data.batch(rows, device=self.device)
                bufs = {k: v.clone() for k, v in buffers.items()}
                with torch.no_grad():
                    out = functional_call(
                        self.model, ({**frozen, **_params(work, train_keys)}, bufs), (x,)
                    )
            finally:
                self.model.train(mode)
                h1.remove()
                h2.remove()
            exact = (
                len(seen) == 2
                and len(seen[0][0]) == 1
                and not seen[0][1]
                and isinstance(seen[0][0][0], torch.Tensor)
                and seen[1][1] is out
                and all(  # the frozen path leaves every buffer as it was (no train-mode BN)
                    torch.equal(v, bufs[k]) for k, v in buffers.items() if not k.startswith(prefix)
                )
            )
            return (seen[0][0][0] if exact else None), exact

        first = torch.cat(list(shards))[:2]
        feat, exact = frozen_forward(first)
        again, _ = frozen_forward(first)
        # Cacheable: the model is exactly module(input), and the frozen path is deterministic
        # (no dropout or other randomness: the same rows give the same features).
        if not exact or feat is None or again is None or not torch.equal(feat, again):
            self._caches[key] = None
            return None
        n = len(data.labels)
        row_bytes = feat[0].numel() * feat.element_size()
        if n * row_bytes > FEATURE_CACHE_SHARE * available_memory(self.device):
            self._caches[key] = None
            return None  # too large: the frozen part is recomputed every step
        store = torch.empty((n, *feat.shape[1:]), dtype=feat.dtype, device=self.device)

        def fill(rows: torch.Tensor) -> torch.Tensor:
            features, ok = frozen_forward(rows)
            assert ok and features is not None  # checked on the first rows
            return features

        cache = FeatureCache(
            module=module,
            prefix=prefix,
            store=store,
            have=torch.zeros(n, dtype=torch.bool),
            labels=data.labels.to(self.device),
            frozen_refs=dict(frozen),
            fill=fill,
        )
        rows = torch.cat(list(shards))
        cache.ensure(rows)
        self._caches[key] = cache
        return cache

    def _history_cache(
        self,
        work: StateDict,
        train_keys: Sequence[str],
        frozen: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        data: Any,
        shards: Sequence[torch.Tensor],
        training: bool = True,
    ) -> FeatureCache | None:
        """The CLS state after every block, per sample: (N, exits, H), for early-exit methods
        whose exit ``l`` is one head reading the CLS state after block ``l`` of a frozen
        encoder (``exit_head_path``; not the Accumulator, whose token later blocks read)."""
        model = self.model
        plan, heads = exit_plan(model), exit_heads(model)
        if plan is None or heads is None or not hasattr(data, "labels"):
            return None
        if any(not any(k.startswith(h + ".") for h in heads) for k in train_keys):
            return None  # something besides the heads trains: the encoder is not frozen
        key = (id(data), tuple(train_keys), training, "history")
        if key in self._caches and self._caches[key] is None:
            return None
        cache = self._caches.get(key)
        if cache is not None and _unchanged(frozen, cache.frozen_refs):
            cache.ensure(torch.cat(list(shards)))
            return cache
        self._caches.pop(key, None)
        blocks = model.get_submodule(plan.blocks_path)
        cls = cls_index(model)
        params = {**frozen, **_params(work, train_keys)}

        def run(
            rows: torch.Tensor, exit_k: int, train_mode: bool = training
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """(CLS states (B, exit_k + 1, H), the model's output) with the exit forced (in
            evaluation mode every block runs: the inference exit is unset meanwhile)."""
            states: list[torch.Tensor] = []

            def grab(_m: nn.Module, _a: Any, out: Any) -> None:
                h = out[0] if isinstance(out, tuple) else out
                states.append(h[:, cls])

            hooks = [b.register_forward_hook(grab) for b in blocks.children()]
            mode, forced, inference = model.training, plan.forced, plan.exit
            model.train(train_mode)
            plan.forced, plan.exit = exit_k, None
            try:
                x, _ = data.batch(rows, device=self.device)
                bufs = {k: v.clone() for k, v in buffers.items()}
                with torch.no_grad():
                    out = functional_call(model, (params, bufs), (x,))
            finally:
                model.train(mode)
                plan.forced, plan.exit = forced, inference
                for h in hooks:
                    h.remove()
            return torch.stack(states, dim=1), out

        last = plan.num_exits - 1
        probe_rows = torch.cat(list(shards))[:2]
        if not len(probe_rows):
            return None
        feats, _ = run(probe_rows, last)
        again, _ = run(probe_rows, last)
        ok = torch.equal(feats, again)
        with torch.no_grad():
            trained, _ = run(probe_rows, last, True)
            for k in range(plan.num_exits) if ok else ():
                z, out = run(probe_rows, k, True)  # the training forward pass at exit k
                head = model.get_submodule(heads[k])
                logits = functional_call(head, _under(params, heads[k] + "."), (z[:, k],))
                ok = ok and torch.equal(out, logits) and torch.equal(z[:, k], trained[:, k])
        n = len(data.labels)
        row_bytes = feats[0].numel() * feats.element_size()
        if not ok or n * row_bytes > FEATURE_CACHE_SHARE * available_memory(self.device):
            self._caches[key] = None
            return None
        cache = FeatureCache(
            module=model,
            prefix="",
            store=torch.empty((n, *feats.shape[1:]), dtype=feats.dtype, device=self.device),
            have=torch.zeros(n, dtype=torch.bool),
            labels=data.labels.to(self.device),
            frozen_refs=dict(frozen),
            fill=lambda rows: run(rows, last)[0],
        )
        cache.ensure(torch.cat(list(shards)))
        self._caches[key] = cache
        return cache

    # -- evaluation ----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self,
        state: StateDict,
        data: Any,
        indices: np.ndarray,
        trainable: frozenset[str] | None,
        batch_size: int = 1000,
    ) -> tuple[int, float, int, tuple[int, ...]] | None:
        """(correct, summed loss, samples, correct per early exit) of ``state`` on
        ``data[indices]`` from cached frozen features (evaluation mode), as
        ``fedcore.client.evaluate`` / ``fedcore.exits.evaluate_exits`` compute them; None
        where the frozen part is not cacheable."""
        if trainable is None:
            return None
        work = {k: v.detach().to(self.device) for k, v in state.items()}
        params, buffers = split_state(self.model, work)
        train_keys = [k for k in params if k in trainable]
        frozen = {k: v for k, v in params.items() if k not in trainable}
        idx = torch.as_tensor(indices, dtype=torch.int64)
        plan = exit_plan(self.model)
        if plan is not None:
            hist = self._history_cache(
                work, train_keys, frozen, buffers, data, [idx], training=False
            )
            return None if hist is None else self._evaluate_exits(hist, work, idx, plan)
        cache = self._feature_cache(work, train_keys, frozen, buffers, data, [idx], training=False)
        if cache is None:
            return None
        head = cache.module
        mode = head.training
        head.eval()
        try:
            own = _under(work, cache.prefix)
            correct, loss_sum = 0, 0.0
            for pos in idx.split(batch_size):
                x, y = cache.batch(pos)
                logits = functional_call(head, own, (x,))
                loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(dim=1) == y).sum())
        finally:
            head.train(mode)
        return correct, loss_sum, int(idx.numel()), ()

    def _evaluate_exits(
        self, cache: FeatureCache, work: StateDict, idx: torch.Tensor, plan: Any, batch: int = 500
    ) -> tuple[int, float, int, tuple[int, ...]]:
        heads = exit_heads(self.model)
        assert heads is not None  # the history cache exists only for declared exit heads
        chosen = plan.num_exits - 1 if plan.exit is None else plan.exit
        per_exit = [0] * plan.num_exits
        correct, loss_sum = 0, 0.0
        for pos in idx.split(batch):
            z, y = cache.batch(pos)
            for k, path in enumerate(heads):
                head = self.model.get_submodule(path)
                logits = functional_call(head, _under(work, path + "."), (z[:, k],))
                hits = logits.argmax(dim=1) == y
                per_exit[k] += int(hits.sum())
                if k == chosen:
                    loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
                    correct += int(hits.sum())
        return correct, loss_sum, int(idx.numel()), tuple(per_exit)

    # -- probes --------------------------------------------------------------------------
    def _probe(
        self,
        key: tuple,
        target: nn.Module,
        prefix: str,
        trainable: dict[str, torch.Tensor],
        frozen: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        fn: ObjectiveFn,
        ctx: Mapping[str, torch.Tensor],
    ) -> _Probe:
        probe = self._probes.get(key)
        if probe is not None:
            return probe
        params = {k: v.detach().clone().requires_grad_(True) for k, v in trainable.items()}
        bufs = {k: v.clone() for k, v in buffers.items()}
        fixed = _under(frozen, prefix)
        logits = functional_call(
            target, (_under(params, prefix) | _under(bufs, prefix), fixed), (x,)
        )
        loss = fn(logits, y, params, ctx)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        used = tuple(k for k, g in zip(params, grads, strict=True) if g is not None)
        changing = frozenset(
            k for k, v in buffers.items() if not torch.equal(v, bufs[k]) or v.dtype == torch.int64
        )
        probe = _Probe(used, changing)
        self._probes[key] = probe
        return probe

    # -- one cohort ----------------------------------------------------------------------
    def train(
        self,
        state: StateDict,
        data: Any,
        clients: Sequence[CohortClient],
        *,
        lr: float,
        cfg: LocalConfig,
        fn: ObjectiveFn,
        ctxs: Sequence[Mapping[str, torch.Tensor]],
        trainable: frozenset[str] | None = None,
    ) -> list[LocalResult]:
        """Local training of ``clients`` from the same ``state`` (the global model they
        downloaded); the i-th result equals ``train_locally`` of client i."""
        if cfg.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {cfg.optimizer!r})"
            )
        start = time.perf_counter()
        dev = self.device
        model = self.model
        model.train()
        work = {k: v.detach().to(dev) for k, v in state.items()}
        params, buffers = split_state(model, work)
        train_keys = [k for k in params if trainable is None or k in trainable]
        frozen = {k: v for k, v in params.items() if k not in set(train_keys)}
        n = len(clients)
        gens = [torch.Generator().manual_seed(c.seed) for c in clients]
        shards = [torch.as_tensor(c.indices, dtype=torch.int64) for c in clients]
        orders = [batch_order(len(s), cfg, g) for s, g in zip(shards, gens, strict=True)]
        steps = [len(o) for o in orders]
        plan = exit_plan(model)
        exits = (
            None
            if plan is None
            else [
                plan.client_exits(c.client_id, c.seed, k)
                for c, k in zip(clients, steps, strict=True)
            ]
        )

        # Cached frozen features: the trained part is one module fed by a frozen, noise-free
        # path; its input per sample is computed once and reused (FeatureCache).
        cache = None
        history = False  # early exits whose heads read cached CLS states (lw_linear, lw_mlp)
        heads = exit_heads(model)
        if all(c.noise_var == 0.0 for c in clients):
            if exits is None:
                cache = self._feature_cache(work, train_keys, frozen, buffers, data, shards)
            else:
                cache = self._history_cache(work, train_keys, frozen, buffers, data, shards)
                history = cache is not None
        target, prefix = (model, "") if cache is None else (cache.module, cache.prefix)

        def stack(v: torch.Tensor) -> torch.Tensor:
            return v.unsqueeze(0).expand(n, *v.shape).clone()

        P = {k: stack(params[k]) for k in train_keys}  # (n, ...) per client
        B: dict[str, torch.Tensor] = {}  # changing buffers, stacked once known
        ctx_stacked = {
            k: torch.stack([c[k] for c in ctxs]).to(dev) for k in (ctxs[0] if ctxs else {})
        }
        adam = cfg.optimizer == "adamw"
        mom: dict[str, torch.Tensor] = {}  # SGD momentum buffers (n, ...)
        started: dict[str, torch.Tensor] = {}  # (n,) bool: momentum/Adam state exists
        exp_avg: dict[str, torch.Tensor] = {}
        exp_avg_sq: dict[str, torch.Tensor] = {}
        adam_steps: dict[str, torch.Tensor] = {}  # (n,) float steps per client
        losses: list[list[torch.Tensor]] = [[] for _ in range(n)]
        seen = [0] * n

        for s in range(max(steps, default=0)):
            batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            groups: dict[tuple, list[int]] = {}
            for i in range(n):
                if s >= steps[i]:
                    continue
                pos = orders[i][s]
                if cache is None:
                    x, y = data.batch(
                        shards[i][pos],
                        noise_var=clients[i].noise_var,
                        generator=gens[i],
                        device=dev,
                    )
                else:
                    x, y = cache.batch(shards[i][pos])
                    if history:
                        assert exits is not None
                        x = x[:, int(exits[i][s])]  # the CLS state its exit reads
                batches[i] = (x, y)
                seen[i] += len(pos)
                at = -1 if exits is None else int(exits[i][s])
                groups.setdefault((tuple(x.shape), tuple(y.shape), at), []).append(i)
            for (xshape, _, exit_k), idx in groups.items():
                if history:  # this exit's head alone, on the cached CLS states
                    assert heads is not None
                    path = heads[exit_k]
                    target, prefix = model.get_submodule(path), path + "."
                self._group_step(
                    idx, n, batches, exit_k, plan, P, B, frozen, buffers, fn, ctxs, ctx_stacked,
                    lr, cfg, adam, mom, started, exp_avg, exp_avg_sq, adam_steps, losses,
                    tuple(train_keys), xshape, target, prefix,
                )  # fmt: skip
        seconds = time.perf_counter() - start
        total_seen = max(1, sum(seen))
        results = []
        for i in range(n):
            out = dict(work)
            for k in train_keys:
                out[k] = P[k][i]
            for k, v in B.items():
                out[k] = v[i]
            out = {k: out[k].detach().contiguous() for k in work}  # the state dict's order
            mean_loss = float(torch.stack(losses[i]).mean()) if losses[i] else float("nan")
            results.append(
                LocalResult(
                    state=out,
                    num_samples=len(shards[i]),
                    num_steps=steps[i],
                    samples_seen=seen[i],
                    train_loss=mean_loss,
                    seconds=seconds * seen[i] / total_seen,  # the cohort's time, by samples
                )
            )
        return results

    def _group_step(
        self, idx, n, batches, exit_k, plan, P, B, frozen, buffers, fn, ctxs, ctx_stacked,
        lr, cfg, adam, mom, started, exp_avg, exp_avg_sq, adam_steps, losses, train_keys, xshape,
        target, prefix,
    ) -> None:  # fmt: skip
        whole = len(idx) == n and idx == list(range(n))
        sel = (
            None
            if whole
            else torch.as_tensor(idx, device=P[train_keys[0]].device if train_keys else "cpu")
        )
        x = torch.stack([batches[i][0] for i in idx])
        y = torch.stack([batches[i][1] for i in idx])
        saved_forced = None
        if plan is not None:
            saved_forced = plan.forced
            plan.forced = exit_k
        try:
            i0 = idx[0]
            first_params = {k: P[k][i0] for k in train_keys}
            first_bufs = {k: (B[k][i0] if k in B else v) for k, v in buffers.items()}
            probe = self._probe(
                (train_keys, exit_k, xshape, prefix), target, prefix, first_params, frozen,
                first_bufs, batches[i0][0], batches[i0][1], fn, ctxs[i0],
            )  # fmt: skip
            for k in probe.changing:
                if k not in B:
                    B[k] = buffers[k].unsqueeze(0).expand(n, *buffers[k].shape).clone()
            shared_bufs = {k: v for k, v in buffers.items() if k not in B}
            used = probe.used
            Pg = {k: (P[k] if whole else P[k].index_select(0, sel)) for k in used}
            Bg = {k: (v if whole else v.index_select(0, sel)) for k, v in B.items()}
            Cg = {k: (v if whole else v.index_select(0, sel)) for k, v in ctx_stacked.items()}
            # Trainable parameters without a gradient this step still shape the forward pass.
            idle = {
                k: (P[k] if whole else P[k].index_select(0, sel))
                for k in train_keys
                if k not in set(used)
            }

            fixed = _under(frozen, prefix) | _under(shared_bufs, prefix)

            def loss_of(p, idle_p, bufs, xb, yb, ctx):
                own = _under(p, prefix) | _under(idle_p, prefix) | _under(bufs, prefix)
                logits = functional_call(target, (own, fixed), (xb,))
                return fn(logits, yb, {**p, **idle_p}, ctx)

            def step(p, idle_p, bufs, xb, yb, ctx):
                return grad_and_value(loss_of)(p, idle_p, bufs, xb, yb, ctx)

            grads, loss = vmap(step, randomness="error")(Pg, idle, Bg, x, y, Cg)
        finally:
            if plan is not None:
                plan.forced = saved_forced
        with torch.no_grad():
            for k in used:
                p, g = Pg[k], grads[k]
                if adam:
                    self._adam(k, p, g, sel, n, lr, cfg, started, exp_avg, exp_avg_sq, adam_steps)
                else:
                    self._sgd(k, p, g, sel, n, lr, cfg, mom, started)
                if not whole:
                    P[k].index_copy_(0, sel, p)
            if not whole:
                for k, v in Bg.items():
                    B[k].index_copy_(0, sel, v)
        for j, i in enumerate(idx):
            losses[i].append(loss[j].detach())

    @staticmethod
    def _sgd(k, p, g, sel, n, lr, cfg, mom, started) -> None:
        """torch.optim.sgd's single-tensor update on stacked clients (p updated in place)."""
        d_p = g if cfg.weight_decay == 0 else g.add(p, alpha=cfg.weight_decay)
        if cfg.momentum != 0:
            if k not in mom:
                mom[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
                # On the host: which clients have a momentum buffer is bookkeeping, and a
                # device tensor here would make every step wait for the device.
                started[k] = torch.zeros(n, dtype=torch.bool)
            buf = mom[k] if sel is None else mom[k].index_select(0, sel)
            was = started[k] if sel is None else started[k].index_select(0, sel.cpu())
            new = buf.mul(cfg.momentum).add_(d_p)  # buf * momentum + (1 - dampening) * d_p
            if not bool(was.all()):  # first step of a client: buf = d_p
                shape = (-1,) + (1,) * (p.dim() - 1)
                new = torch.where(was.view(shape).to(p.device), new, d_p)
            if sel is None:
                mom[k] = new
                started[k].fill_(True)
            else:
                mom[k].index_copy_(0, sel, new)
                started[k].index_fill_(0, sel.cpu(), True)
            d_p = new
        p.add_(d_p, alpha=-lr)

    @staticmethod
    def _adam(k, p, g, sel, n, lr, cfg, started, exp_avg, exp_avg_sq, adam_steps) -> None:
        """torch.optim.adam's single-tensor update (decoupled weight decay, betas 0.9/0.999,
        eps 1e-8) on stacked clients; each client's step count is its own."""
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        if k not in exp_avg:
            exp_avg[k] = torch.zeros((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
            exp_avg_sq[k] = torch.zeros_like(exp_avg[k])
            adam_steps[k] = torch.zeros(n, dtype=torch.float32)
        m = exp_avg[k] if sel is None else exp_avg[k].index_select(0, sel)
        v = exp_avg_sq[k] if sel is None else exp_avg_sq[k].index_select(0, sel)
        st = adam_steps[k] if sel is None else adam_steps[k].index_select(0, sel.cpu())
        if cfg.weight_decay != 0:
            p.mul_(1 - lr * cfg.weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        st = st + 1
        shape = (-1,) + (1,) * (p.dim() - 1)
        # Per client: bias corrections of its own step (Python floats in torch.optim.adam).
        steps_list = [float(t) for t in st]
        if len(set(steps_list)) == 1:
            step = steps_list[0]
            step_size = lr / (1 - beta1**step)
            bc2_sqrt = (1 - beta2**step) ** 0.5
            denom = (v.sqrt() / bc2_sqrt).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)
        else:
            step_size = torch.tensor(
                [lr / (1 - beta1**t) for t in steps_list], dtype=p.dtype, device=p.device
            ).view(shape)
            bc2_sqrt = torch.tensor(
                [(1 - beta2**t) ** 0.5 for t in steps_list], dtype=p.dtype, device=p.device
            ).view(shape)
            denom = (v.sqrt() / bc2_sqrt).add_(eps)
            p.sub_(step_size * m / denom)
        if sel is None:
            exp_avg[k], exp_avg_sq[k], adam_steps[k] = m, v, st
        else:
            exp_avg[k].index_copy_(0, sel, m)
            exp_avg_sq[k].index_copy_(0, sel, v)
            adam_steps[k].index_copy_(0, sel.cpu(), st)
