"""The cohort trainer: one local step of every client of a cohort as one vmapped call
(``fedcore.cohort``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedcore.client import (
    OPTIMIZERS,
    LocalConfig,
    ObjectiveFn,
    split_state,
)
from fedcore.cohort.features import FeatureCaches
from fedcore.cohort.layout import (
    CohortResult,
    RoundLayout,
    finite_rows,
    mean_losses,
    step_positions,
)
from fedcore.cohort.optim import adam_step, sgd_step
from fedcore.cohort.plan import CohortClient
from fedcore.cohort.util import activation_bytes, available_memory, under
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
        fixed = under(frozen, prefix)
        logits = functional_call(target, (under(params, prefix) | under(bufs, prefix), fixed), (x,))
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
        check: Sequence[str] | None = None,
    ) -> CohortResult:
        """Local training of ``clients`` from the same ``state`` (the global model they
        downloaded): row i of the result equals ``train_locally`` of client i
        (``CohortResult.result(i)``). The clients' states are left stacked, with one
        read-back from the device for the whole cohort: the losses, and per client whether
        the tensors named in ``check`` (None: every tensor) are finite."""
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
        orders = [
            step_positions(len(c.indices), cfg, g) for c, g in zip(clients, gens, strict=True)
        ]
        steps = [len(o[1]) for o in orders]
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
            shards = [torch.as_tensor(c.indices, dtype=torch.int64) for c in clients]
            if exits is None:
                cache = self.caches.features(work, train_keys, frozen, buffers, data, shards)
            else:
                cache = self.caches.history(work, train_keys, frozen, buffers, data, shards)
                history = cache is not None
        target, prefix = (model, "") if cache is None else (cache.module, cache.prefix)
        # Whole groups gathered at once (fixed-shape samples, no per-client noise); else one
        # batch per client (text batches are cut to their longest row; noise is drawn per
        # client from its generator).
        gathered = cache is not None or (
            not getattr(data, "ragged", False) and all(c.noise_var == 0.0 for c in clients)
        )
        layout = RoundLayout.build(clients, orders, exits, dev, gathered)

        def stack(v: torch.Tensor) -> torch.Tensor:
            return v.unsqueeze(0).expand(n, *v.shape).clone()

        P = {k: stack(params[k]) for k in train_keys}  # (n, ...) per client
        B: dict[str, torch.Tensor] = {}  # changing buffers, stacked once known
        ctx_stacked = {
            k: torch.stack([c[k] for c in ctxs]).to(dev) for k in (ctxs[0] if ctxs else {})
        }
        adam = cfg.optimizer == "adamw"
        mom: dict[str, torch.Tensor] = {}  # SGD momentum buffers (n, ...)
        started: dict[str, np.ndarray] = {}  # (n,) bool on the host: optimiser state exists
        exp_avg: dict[str, torch.Tensor] = {}
        exp_avg_sq: dict[str, torch.Tensor] = {}
        adam_steps: dict[str, np.ndarray] = {}  # (n,) float steps per client, on the host
        losses: list[torch.Tensor] = []  # per group step, (g,): the layout's loss order

        steps_fns: dict[tuple, Any] = {}  # the vmapped step functions of this cohort
        loss_rows: list[tuple[int, ...]] = []  # the rows of each entry of losses
        for s, groups in enumerate(layout.steps):
            for grp in groups:
                if gathered:
                    idx = layout.indices(grp)
                    x, y = data.batch(idx, device=dev) if cache is None else cache.batch(idx)
                    x = x.view(len(grp.rows), grp.size, *x.shape[1:])
                    y = y.view(len(grp.rows), grp.size, *y.shape[1:])
                    if history:
                        x = x[:, :, grp.exit]  # the CLS state its exit reads
                    parts = [(grp, x, y)]
                else:
                    parts = self._client_batches(grp, s, layout, data, clients, gens, dev)
                if history:  # this exit's head alone, on the cached CLS states
                    assert heads is not None
                    path = heads[grp.exit]
                    target, prefix = model.get_submodule(path), path + "."
                for part, x, y in parts:
                    losses.append(
                        self._group_step(
                            part, n, x, y, plan, P, B, frozen, buffers, fn, ctxs, ctx_stacked,
                            lr, cfg, adam, mom, started, exp_avg, exp_avg_sq, adam_steps,
                            tuple(train_keys), target, prefix, layout, steps_fns,
                        )
                    )  # fmt: skip
                    loss_rows.append(part.rows)
        states: dict[str, torch.Tensor] = {}
        for k, v in work.items():  # the state dict's order
            if k in P:
                states[k] = P[k].detach()
            elif k in B:
                states[k] = B[k]
            else:  # the global value, shared by every client (not copied)
                states[k] = v.unsqueeze(0).expand(n, *v.shape)
        keys = list(states) if check is None else [k for k in check if k in states]
        flags = finite_rows({k: states[k] for k in keys}, n)
        # The one read-back of the cohort: every step's losses and the finite flags.
        flat = torch.cat([*(t.detach().reshape(-1) for t in losses), flags.to(torch.float64)])
        values = flat.tolist()
        per_client: list[list[float]] = [[] for _ in range(n)]
        pos = 0
        for rows in loss_rows:
            for i in rows:
                per_client[i].append(values[pos])
                pos += 1
        dtype = losses[0].dtype if losses else torch.float32
        train_loss = mean_losses(per_client, dtype)
        return CohortResult(
            states=states,
            num_samples=[len(c.indices) for c in clients],
            num_steps=steps,
            samples_seen=[sum(o[1]) for o in orders],
            train_loss=train_loss,
            finite=[bool(f) for f in values[pos:]],
            seconds=time.perf_counter() - start,
        )

    def _group_step(
        self, grp, n, x, y, plan, P, B, frozen, buffers, fn, ctxs, ctx_stacked, lr, cfg, adam,
        mom, started, exp_avg, exp_avg_sq, adam_steps, train_keys, target, prefix, layout,
        steps_fns,
    ) -> torch.Tensor:  # fmt: skip
        """One local step of the group's clients (``x``, ``y``: (g, batch, ...)); returns
        their losses (g,), left on the device."""
        idx = grp.rows
        whole = len(idx) == n and grp.whole
        sel = None if whole else layout.rows(grp)  # on the device
        host_sel = None if whole else np.asarray(idx)
        saved_forced = None
        if plan is not None:
            saved_forced = plan.forced
            plan.forced = grp.exit
        try:
            i0 = idx[0]
            first_params = {k: P[k][i0] for k in train_keys}
            first_bufs = {k: (B[k][i0] if k in B else v) for k, v in buffers.items()}
            probe = self._probe(
                (train_keys, grp.exit, tuple(x.shape[1:]), prefix), target, prefix,
                first_params, frozen, first_bufs, x[0], y[0], fn, ctxs[i0],
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
            key = (id(target), prefix, frozenset(shared_bufs))
            if key not in steps_fns:
                steps_fns[key] = _vmapped(target, prefix, fn, frozen, shared_bufs)
            grads, loss = steps_fns[key](Pg, idle, Bg, x, y, Cg)
        finally:
            if plan is not None:
                plan.forced = saved_forced
        with torch.no_grad():
            for k in used:
                p, g = Pg[k], grads[k]
                if adam:
                    adam_step(
                        k, p, g, sel, host_sel, n, lr, cfg, started, exp_avg, exp_avg_sq,
                        adam_steps,
                    )  # fmt: skip
                else:
                    sgd_step(k, p, g, sel, host_sel, n, lr, cfg, mom, started)
                if not whole:
                    P[k].index_copy_(0, sel, p)
            if not whole:
                for k, v in Bg.items():
                    B[k].index_copy_(0, sel, v)
        return loss.detach()

    @staticmethod
    def _client_batches(grp, s, layout, data, clients, gens, dev):  # type: ignore[no-untyped-def]
        """The group's batches drawn client by client (text: cut to the batch's longest
        row; Gaussian noise: from the client's generator), split by their shapes into the
        groups one vmapped call can take."""
        shaped: dict[tuple, list] = {}
        for i in grp.rows:
            x, y = data.batch(
                layout.client_batch(i, s),
                noise_var=clients[i].noise_var,
                generator=gens[i],
                device=dev,
            )
            shaped.setdefault((tuple(x.shape), tuple(y.shape)), []).append((i, x, y))
        out = []
        for members in shaped.values():
            rows = tuple(m[0] for m in members)
            part = dataclasses.replace(grp, rows=rows, whole=rows == tuple(range(len(clients))))
            out.append(
                (part, torch.stack([m[1] for m in members]), torch.stack([m[2] for m in members]))
            )
        return out


def _vmapped(target, prefix, fn, frozen, shared_bufs):  # type: ignore[no-untyped-def]
    """One local step of stacked clients: vmap over grad_and_value of the objective, built
    once per cohort and step configuration, reused every step."""
    fixed = under(frozen, prefix) | under(shared_bufs, prefix)

    def loss_of(p, idle_p, bufs, xb, yb, ctx):  # type: ignore[no-untyped-def]
        own = under(p, prefix) | under(idle_p, prefix) | under(bufs, prefix)
        logits = functional_call(target, (own, fixed), (xb,))
        return fn(logits, yb, {**p, **idle_p}, ctx)

    return vmap(grad_and_value(loss_of), randomness="error")
