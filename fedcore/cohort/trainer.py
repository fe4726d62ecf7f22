"""The cohort trainer: one local step of every client of a cohort as one vmapped call
(``fedcore.cohort``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedcore.client import (
    OPTIMIZERS,
    LocalConfig,
    LocalResult,
    ObjectiveFn,
    batch_order,
    split_state,
)
from fedcore.cohort.features import FeatureCaches
from fedcore.cohort.optim import adam_step, sgd_step
from fedcore.cohort.plan import CohortClient
from fedcore.cohort.util import _under, activation_bytes, available_memory
from fedcore.errors import ConfigError
from fedcore.payload import StateDict
from fedcore.protocols import exit_heads, exit_plan


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
        self.caches = FeatureCaches(model, device)  # cached frozen features
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
                cache = self.caches.features(work, train_keys, frozen, buffers, data, shards)
            else:
                cache = self.caches.history(work, train_keys, frozen, buffers, data, shards)
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
                    adam_step(k, p, g, sel, n, lr, cfg, started, exp_avg, exp_avg_sq, adam_steps)
                else:
                    sgd_step(k, p, g, sel, n, lr, cfg, mom, started)
                if not whole:
                    P[k].index_copy_(0, sel, p)
            if not whole:
                for k, v in Bg.items():
                    B[k].index_copy_(0, sel, v)
        for j, i in enumerate(idx):
            losses[i].append(loss[j].detach())
