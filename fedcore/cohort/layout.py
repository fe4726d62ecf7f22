"""What a cohort's round is made of besides the vmapped step (``fedcore.cohort``): the
clients' batch orders laid out per step and group and sent to the device once
(``RoundLayout``), and what comes back (``CohortResult``: stacked states, per-client losses
and finite flags read back once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedcore.client import LocalConfig, LocalResult


def step_positions(
    num_samples: int, cfg: LocalConfig, generator: torch.Generator
) -> tuple[np.ndarray, list[int]]:
    """``fedcore.client.batch_order`` as (the positions into the shard in the order the steps
    read them, each step's batch size): the same draws from ``generator``."""
    perms: list[np.ndarray] = []
    sizes: list[int] = []
    b = cfg.batch_size
    for _ in range(cfg.local_epochs):
        perms.append(torch.randperm(num_samples, generator=generator).numpy())
        sizes.extend([b] * (num_samples // b) + ([num_samples % b] if num_samples % b else []))
    if cfg.max_steps is not None:
        sizes = sizes[: cfg.max_steps]
    pos = np.concatenate(perms) if perms else np.zeros(0, dtype=np.int64)
    return pos[: sum(sizes)], sizes


def mean_losses(per_client: Sequence[Sequence[float]], dtype: torch.dtype) -> list[float]:
    """Each client's mean step loss, as ``train_locally`` takes it (``torch.mean`` of its
    losses in their dtype): one row-wise mean per distinct step count (a row's mean equals
    the mean of the row alone; tests/test_cohort.py checks it); NaN for a client without
    steps."""
    out = [float("nan")] * len(per_client)
    by_steps: dict[int, list[int]] = {}
    for i, v in enumerate(per_client):
        if v:
            by_steps.setdefault(len(v), []).append(i)
    for rows in by_steps.values():
        means = torch.tensor([per_client[i] for i in rows], dtype=dtype).mean(1).tolist()
        for i, m in zip(rows, means, strict=True):
            out[i] = m
    return out


@dataclass(frozen=True)
class Group:
    """The clients (rows of the cohort) that take step ``step`` with one batch shape."""

    step: int
    rows: tuple[int, ...]
    size: int  # their batch size
    exit: int  # the early exit they train (-1: none)
    whole: bool  # rows == 0..n-1
    at: int  # offset of its sample indices (g x size) in the layout's flat tensor
    rows_at: int  # offset of its rows (g) in the layout's flat tensor


class RoundLayout:
    """Every step's groups, and the dataset indices of every group's batches, computed on
    the host from the clients' draws and sent to the device in one pinned, non-blocking copy
    (``gathered``; else per-client batches, read by :meth:`client_batch`)."""

    def __init__(self, steps, flat, seqs, starts, device) -> None:  # type: ignore[no-untyped-def]
        self.steps: list[list[Group]] = steps
        self.device = device
        self.flat: torch.Tensor | None = flat
        self._seqs, self._starts = seqs, starts

    @classmethod
    def build(cls, clients, orders, exits, device, gathered) -> RoundLayout:  # type: ignore[no-untyped-def]
        seqs = [
            np.asarray(c.indices, dtype=np.int64)[pos]
            for c, (pos, _) in zip(clients, orders, strict=True)
        ]
        starts = [np.concatenate([[0], np.cumsum(sizes)]) for _, sizes in orders]
        n = len(clients)
        chunks: list[np.ndarray] = []
        at = 0
        steps: list[list[Group]] = []
        for s in range(max((len(o[1]) for o in orders), default=0)):
            keyed: dict[tuple[int, int], list[int]] = {}
            for i, (_, sizes) in enumerate(orders):
                if s < len(sizes):
                    ex = -1 if exits is None else int(exits[i][s])
                    keyed.setdefault((sizes[s], ex), []).append(i)
            groups = []
            for (size, ex), rows in keyed.items():
                whole = rows == list(range(n))
                idx_at = at
                if gathered:
                    chunks.append(
                        np.concatenate([seqs[i][starts[i][s] : starts[i][s] + size] for i in rows])
                    )
                    at += len(rows) * size
                rows_at = at
                if gathered and not whole:
                    chunks.append(np.asarray(rows, dtype=np.int64))
                    at += len(rows)
                groups.append(Group(s, tuple(rows), size, ex, whole, idx_at, rows_at))
            steps.append(groups)
        flat = None
        if gathered:
            host = torch.from_numpy(np.concatenate(chunks) if chunks else np.zeros(0, np.int64))
            if torch.device(device).type == "cuda":
                host = host.pin_memory()
            flat = host.to(device, non_blocking=True)
        return cls(steps, flat, seqs, starts, device)

    def indices(self, grp: Group) -> torch.Tensor:
        """The group's dataset indices, (g x size,) on the device, client by client."""
        assert self.flat is not None
        return self.flat[grp.at : grp.at + len(grp.rows) * grp.size]

    def rows(self, grp: Group) -> torch.Tensor:
        """The group's rows of the cohort, (g,), on the device."""
        if self.flat is None or grp.rows_at < 0:
            return torch.as_tensor(grp.rows, dtype=torch.int64, device=self.device)
        return self.flat[grp.rows_at : grp.rows_at + len(grp.rows)]

    def client_batch(self, i: int, s: int) -> torch.Tensor:
        """Client ``i``'s dataset indices at step ``s`` (on the host)."""
        lo, hi = self._starts[i][s], self._starts[i][s + 1]
        return torch.from_numpy(self._seqs[i][lo:hi])


def finite_rows(states: Mapping[str, torch.Tensor], n: int) -> torch.Tensor:
    """(n,) bool: row i of every floating-point tensor of ``states`` is free of NaN and Inf.

    A float64 sum of a row is finite exactly when every element is (float32 magnitudes stay
    far from float64's range; NaN and Inf propagate, +Inf and -Inf give NaN): one reduction
    per tensor, no host read."""
    sums = [v.reshape(n, -1).sum(1, dtype=torch.float64) for v in states.values()
            if v.is_floating_point()]  # fmt: skip
    if not sums:
        return torch.ones(n, dtype=torch.bool)
    return torch.isfinite(torch.stack(sums).sum(0))


@dataclass
class CohortResult:
    """A cohort's local training: the clients' states stacked (row i: client i; a tensor
    no client changes is the global value, expanded without a copy) and, per client, what
    ``fedcore.client.LocalResult`` holds, read back from the device once."""

    states: dict[str, torch.Tensor]
    num_samples: list[int]
    num_steps: list[int]
    samples_seen: list[int]
    train_loss: list[float]
    finite: list[bool]  # the checked tensors of the row are free of NaN and Inf
    seconds: float  # the cohort's time

    def client_seconds(self, i: int) -> float:
        """The cohort's time, shared by samples seen."""
        return self.seconds * self.samples_seen[i] / max(1, sum(self.samples_seen))

    def result(self, i: int) -> LocalResult:
        """Client ``i``'s result as ``train_locally`` returns it (own, contiguous tensors)."""
        return LocalResult(
            state={k: v[i].detach().clone() for k, v in self.states.items()},
            num_samples=self.num_samples[i],
            num_steps=self.num_steps[i],
            samples_seen=self.samples_seen[i],
            train_loss=self.train_loss[i],
            seconds=self.client_seconds(i),
        )
