"""Cached frozen features: what the frozen part of the model computes for a sample, computed
once per sample and reused in every step, client and round (``fedcore.cohort``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedcore.client import split_state
from fedcore.cohort.util import available_memory, common_module, picked, unchanged, under
from fedcore.payload import StateDict
from fedcore.protocols import cls_index, exit_heads, exit_plan


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


class FeatureCaches:
    """The feature caches of one model on one device, keyed by data, trained part and mode;
    a configuration found not cacheable is remembered as None."""

    def __init__(self, model: nn.Module, device: str) -> None:
        self.model = model
        self.device = device
        self._caches: dict[tuple, FeatureCache | None] = {}

    def features(
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
        path = common_module(train_keys)
        if not path:
            return None
        key = (id(data), tuple(train_keys), training)
        if key in self._caches and self._caches[key] is None:
            return None  # found not cacheable for this model, trained part and data
        cache = self._caches.get(key)
        if cache is not None and unchanged(frozen, cache.frozen_refs):
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
                        self.model, ({**frozen, **picked(work, train_keys)}, bufs), (x,)
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

    def history(
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
        if cache is not None and unchanged(frozen, cache.frozen_refs):
            cache.ensure(torch.cat(list(shards)))
            return cache
        self._caches.pop(key, None)
        blocks = model.get_submodule(plan.blocks_path)
        cls = cls_index(model)
        params = {**frozen, **picked(work, train_keys)}

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
                logits = functional_call(head, under(params, heads[k] + "."), (z[:, k],))
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
            hist = self.history(work, train_keys, frozen, buffers, data, [idx], training=False)
            return None if hist is None else self._evaluate_exits(hist, work, idx, plan)
        cache = self.features(work, train_keys, frozen, buffers, data, [idx], training=False)
        if cache is None:
            return None
        head = cache.module
        mode = head.training
        head.eval()
        try:
            own = under(work, cache.prefix)
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
                logits = functional_call(head, under(work, path + "."), (z[:, k],))
                hits = logits.argmax(dim=1) == y
                per_exit[k] += int(hits.sum())
                if k == chosen:
                    loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
                    correct += int(hits.sum())
        return correct, loss_sum, int(idx.numel()), tuple(per_exit)
