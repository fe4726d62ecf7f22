"""Client-side computation as functions of (parameters, batch, hyper-parameters).

A client is not a resident model object: one module per process serves every client through
``torch.func.functional_call``, with that client's parameters passed in. This keeps memory
flat in the number of simulated clients and leaves room for a cohort-vectorized path that
runs many clients' steps as one batched computation.

The SGD update is PyTorch's own functional SGD (``torch.optim.sgd.sgd``, single-tensor
path), so a client reproduces ``torch.optim.SGD`` bit for bit on the same batches; the AdamW
update (``optimizer="adamw"``) is ``torch.optim.adam.adam`` with decoupled weight decay, what
``torch.optim.AdamW`` runs.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from fedcore.inputs import to_model_input
from fedcore.payload import StateDict
from fedcore.sampling import derive_seed

LossFn = Callable[[torch.Tensor, torch.Tensor, StateDict], torch.Tensor]

ObjectiveFn = Callable[
    [torch.Tensor, torch.Tensor, StateDict, Mapping[str, torch.Tensor]], torch.Tensor
]


@dataclass(frozen=True)
class Objective:
    """A client's loss as a function shared by the clients of a round plus this client's
    tensors: ``fn(logits, targets, params, ctx)``.

    ``fn`` may close over the global model and hyper-parameters (FedProx's anchor and mu), never
    over anything of one client: that goes in ``ctx`` (FedIR's importance weights), which the
    cohort engine stacks along the client dimension. Called with (logits, targets, params) it
    is a plain ``fedcore.client.LossFn``, so the sequential engine runs it unchanged.
    """

    fn: ObjectiveFn
    ctx: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __call__(
        self, logits: torch.Tensor, targets: torch.Tensor, params: StateDict
    ) -> torch.Tensor:
        return self.fn(logits, targets, params, self.ctx)


@dataclass(frozen=True)
class LocalConfig:
    """Local optimisation hyper-parameters (seed 000 §IV: SGD, momentum 0.9, wd 5e-4)."""

    local_epochs: int = 1
    batch_size: int = 32
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_steps: int | None = None  # cap on local steps per round (None: full epochs)
    # "sgd" (momentum, weight_decay) or "adamw" (betas 0.9/0.999, eps 1e-8, decoupled
    # weight_decay; momentum unused). A client starts every round with fresh optimiser state.
    optimizer: str = "sgd"


OPTIMIZERS = ("sgd", "adamw")

# The stream of a client's stochastic layers (dropout, drop-connect / stochastic depth, PEFT's
# lora_dropout): derive_seed(seed, MODEL_STREAM) of the job's own seed, i.e. of (run seed,
# round, client, slot). Distinct from the batch-order / noise generator seeded with ``seed``.
MODEL_STREAM = 0x6D6F64656C  # "model"


@dataclass
class AdamState:
    """torch.optim.AdamW's per-parameter state for one client's local steps."""

    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    steps: list[torch.Tensor]

    @classmethod
    def zeros(cls, tensors: list[torch.Tensor]) -> AdamState:
        return cls(
            [torch.zeros_like(t) for t in tensors],
            [torch.zeros_like(t) for t in tensors],
            [torch.tensor(0.0) for _ in tensors],
        )


class ImageData:
    """uint8 images kept once in memory; batches are normalised (and noised) on the fly."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        *,
        size: int | None = None,
        channels: int | None = None,
    ) -> None:
        self.images = images  # (N, C, H, W) uint8
        self.labels = labels  # (N,) int64
        # The backbone's input (fedcore.inputs): batches are resized to size x size and gray
        # images repeated to ``channels``; mean/std are per channel of that input.
        self.size, self.channels = size, channels
        c = channels or images.shape[1]
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batch(
        self,
        idx: torch.Tensor,
        *,
        noise_var: float = 0.0,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Gathered, converted and normalised where the images are (on the device when they
        # were moved there with ``to``), then moved to ``device`` if that is elsewhere.
        idx = idx.to(self.images.device)
        x = self.images.index_select(0, idx).to(torch.float32).div_(255.0)
        x = to_model_input(x, self.size, self.channels)
        x = (x - self._mean) / self._std  # (B, C, H, W)
        if noise_var > 0.0:
            # Seed 000 §IV feature skew: x^ = x + e, e ~ N(0, sigma*i/N), drawn per access
            # as NIID-Bench's AddGaussianNoise transform does. Drawn from the client's CPU
            # generator wherever the images are, so the noise does not depend on the device.
            e = torch.randn(x.shape, generator=generator) * math.sqrt(noise_var)
            x = x + e.to(x.device)
        return x.to(device), self.labels.index_select(0, idx).to(device)

    def to(self, device: torch.device | str) -> ImageData:
        """The same data with the uint8 images, labels and statistics on ``device``
        (itself when already there): batches are then gathered and normalised there."""
        if self.images.device == torch.device(device):
            return self
        out = copy.copy(self)
        out.images, out.labels = self.images.to(device), self.labels.to(device)
        out._mean, out._std = self._mean.to(device), self._std.to(device)
        return out

    def share_memory_(self) -> ImageData:
        self.images.share_memory_()
        self.labels.share_memory_()
        return self


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, params: StateDict) -> torch.Tensor:
    """FedAvg's client objective (a mean over the batch)."""
    return nn.functional.cross_entropy(logits, targets)


def split_state(model: nn.Module, state: StateDict) -> tuple[StateDict, StateDict]:
    """Split a state dict into (trainable parameters, buffers) by the module's own names."""
    param_names = {n for n, _ in model.named_parameters()}
    params = {k: v for k, v in state.items() if k in param_names}
    buffers = {k: v for k, v in state.items() if k not in param_names}
    return params, buffers


def local_sgd_step(
    model: nn.Module,
    params: StateDict,
    buffers: StateDict,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    cfg: LocalConfig,
    momentum_buffers: list[torch.Tensor | None],
    loss_fn: LossFn = cross_entropy,
    adam_state: AdamState | None = None,
) -> torch.Tensor:
    """One SGD (or AdamW, with ``adam_state``) step on ``params`` (updated in place); returns
    the detached loss.

    ``buffers`` (BatchNorm running statistics) are updated in place by the forward pass.
    """
    logits = functional_call(model, (params, buffers), (x,))
    loss = loss_fn(logits, y, params)
    tensors = list(params.values())
    # allow_unused: an early-exit model's step at exit l leaves the other exits' heads out of
    # the graph; like torch.optim.SGD, parameters without a gradient are skipped.
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    used = [i for i, g in enumerate(grads) if g is not None]
    if adam_state is not None:  # torch.optim.AdamW's own update (functional, single tensor)
        with torch.no_grad():
            adam(
                [tensors[i] for i in used],
                [grads[i] for i in used],  # type: ignore[misc]
                [adam_state.exp_avgs[i] for i in used],
                [adam_state.exp_avg_sqs[i] for i in used],
                [],
                [adam_state.steps[i] for i in used],
                foreach=False,
                decoupled_weight_decay=True,
                amsgrad=False,
                beta1=0.9,
                beta2=0.999,
                lr=lr,
                weight_decay=cfg.weight_decay,
                eps=1e-8,
                maximize=False,
            )
        return loss.detach()
    bufs = momentum_buffers if len(used) == len(tensors) else [momentum_buffers[i] for i in used]
    with torch.no_grad():
        sgd(
            [tensors[i] for i in used],
            [grads[i] for i in used],  # type: ignore[misc]
            bufs,
            foreach=False,
            weight_decay=cfg.weight_decay,
            momentum=cfg.momentum,
            lr=lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
    if bufs is not momentum_buffers:
        for i, buf in zip(used, bufs, strict=True):
            momentum_buffers[i] = buf
    return loss.detach()


@dataclass
class LocalResult:
    state: StateDict  # every tensor of the model after local training
    num_samples: int  # samples in the client's shard (FedAvg's aggregation weight)
    num_steps: int  # local SGD steps taken (tau_i, FedNova's normaliser)
    samples_seen: int  # samples processed over all epochs
    train_loss: float  # mean loss over the local steps
    seconds: float


def batch_order(
    num_samples: int, cfg: LocalConfig, generator: torch.Generator
) -> list[torch.Tensor]:
    """Positions into the client's shard for every local step (reshuffled every epoch)."""
    batches: list[torch.Tensor] = []
    for _ in range(cfg.local_epochs):
        perm = torch.randperm(num_samples, generator=generator)
        batches.extend(perm.split(cfg.batch_size))
    if cfg.max_steps is not None:
        batches = batches[: cfg.max_steps]
    return batches


def train_locally(
    model: nn.Module,
    state: StateDict,
    data: ImageData,
    indices: np.ndarray,
    *,
    lr: float,
    cfg: LocalConfig,
    seed: int,
    noise_var: float = 0.0,
    loss_fn: LossFn = cross_entropy,
    device: torch.device | str = "cpu",
    trainable: frozenset[str] | None = None,
) -> LocalResult:
    """Run a client's local epochs from ``state``; the result depends only on the arguments.

    ``trainable`` names the parameters SGD updates (None: all). The others are frozen: they
    take part in the forward pass like buffers but get no gradient (seed 004 Algorithm 4).
    """
    # Stochastic layers (dropout, drop-connect) draw from torch's global generator. Seeding it
    # from the job's seed for the duration of the job makes their masks a function of
    # (seed, round, client) whatever process, worker or order runs the job (a spawned worker
    # otherwise starts at torch's fixed default seed and advances with every job it happens to
    # get); fork_rng restores the caller's state afterwards, so nothing else changes. Not
    # thread-safe: two jobs training at once in one process would share the generator.
    dev = torch.device(device)
    devices = (
        []
        if dev.type != "cuda"
        else [torch.cuda.current_device() if dev.index is None else dev.index]
    )
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.manual_seed(derive_seed(seed, MODEL_STREAM))
        return _train_locally(
            model, state, data, indices, lr=lr, cfg=cfg, seed=seed, noise_var=noise_var,
            loss_fn=loss_fn, device=device, trainable=trainable,
        )  # fmt: skip


def _train_locally(
    model: nn.Module,
    state: StateDict,
    data: ImageData,
    indices: np.ndarray,
    *,
    lr: float,
    cfg: LocalConfig,
    seed: int,
    noise_var: float,
    loss_fn: LossFn,
    device: torch.device | str,
    trainable: frozenset[str] | None,
) -> LocalResult:
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    shard = torch.as_tensor(indices, dtype=torch.int64)
    work = {k: v.detach().clone().to(device) for k, v in state.items()}
    params, buffers = split_state(model, work)
    if trainable is not None:
        buffers.update({k: v for k, v in params.items() if k not in trainable})
        params = {k: v for k, v in params.items() if k in trainable}
    for p in params.values():
        p.requires_grad_(True)
    momentum_buffers: list[torch.Tensor | None] = [None] * len(params)
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {cfg.optimizer!r})"
        )
    adam_state = AdamState.zeros(list(params.values())) if cfg.optimizer == "adamw" else None
    model.train()
    losses: list[torch.Tensor] = []
    seen = 0
    for pos in batch_order(len(shard), cfg, generator):
        x, y = data.batch(shard[pos], noise_var=noise_var, generator=generator, device=device)
        losses.append(
            local_sgd_step(
                model,
                params,
                buffers,
                x,
                y,
                lr=lr,
                cfg=cfg,
                momentum_buffers=momentum_buffers,
                loss_fn=loss_fn,
                adam_state=adam_state,
            )
        )
        seen += len(pos)
    out = {k: v.detach().contiguous() for k, v in work.items()}
    mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")
    return LocalResult(
        state=out,
        num_samples=len(shard),
        num_steps=len(losses),
        samples_seen=seen,
        train_loss=mean_loss,
        seconds=time.perf_counter() - start,
    )


@torch.no_grad()
def evaluate(
    model: nn.Module,
    state: StateDict,
    data: ImageData,
    indices: np.ndarray | None = None,
    *,
    batch_size: int = 1000,
    device: torch.device | str = "cpu",
) -> tuple[int, float, int]:
    """(correct predictions, summed cross-entropy, samples) of ``state`` on ``data``."""
    model.eval()
    idx = torch.arange(len(data)) if indices is None else torch.as_tensor(indices)
    params, buffers = split_state(model, {k: v.to(device) for k, v in state.items()})
    correct, loss_sum = 0, 0.0
    size = getattr(data, "size", None)  # inputs resized for the backbone (fedcore.inputs)
    if size is not None:
        # Keep a batch's pixels at most those of 1000 32x32 images: at 224x224 that is 20
        # images, not the 1000 whose EfficientNet activations would take tens of GB.
        batch_size = max(1, min(batch_size, batch_size * 32 * 32 // (size * size)))
    for pos in idx.split(batch_size):
        x, y = data.batch(pos, device=device)
        logits = functional_call(model, (params, buffers), (x,))
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
    return correct, loss_sum, int(idx.numel())
