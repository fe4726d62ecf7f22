"""Personalization after federated training (seed 001 §3 "Personalization", §5 Table 4).

Each client fine-tunes the global model on its own data and is tested on held-out data of
its own, before and after. As in the seed, a client's personal data is *corrupted* with a
style of its own: client ``c`` gets severity ``severities[c % len(severities)]`` (0 = clean
.. 5), following Hendrycks and Dietterich (2019):

* images: Gaussian noise in pixel space with CIFAR-C's ``gaussian_noise`` scales
  (0.08, 0.12, 0.18, 0.26, 0.38 for severities 1-5), clipped and stored as uint8 again, as the
  CIFAR-C images are;
* text (token ids): word dropout, each token between the first and the last (CLS and SEP)
  removed with probability 0.1 x severity, the row re-packed to the left (rows stay
  right-padded).

The corruption and the tune/test split of a client come from (seed, client) alone, so results
do not depend on the worker layout or on the order clients are processed in. Fine-tuning is
the engine's own local SGD (:func:`fedcore.client.train_locally`) on the chosen ``scope``:

* ``payload``: what the adapter trains in FL (the whole Accumulator, the adapters, or every
  parameter for ``full``), the seed's "Accumulator" / "Full model" rows;
* ``client_token``: only the Accumulator's client token (the seed's "Client Token Only", 0.38K
  parameters at H = 384).

With early exits, a client tunes and is tested at one fixed exit (seed 001 App. A: "we
fine-tune the pre-trained multi-tier model with a predefined exit layer"; §5: a client's exit
"should be persistently fixed in both training and testing"): its tier in multi-tier FL, else
the inference exit (:func:`fedcore.exits.client_exit`); accuracy before and after are both
read there.

Hand-written: no FL library ships this protocol.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcore.client import ImageData, LocalConfig, evaluate, train_locally
from fedcore.errors import ConfigError
from fedcore.exits import begin_client, client_exit, fixed_exit
from fedcore.payload import StateDict
from fedcore.sampling import derive_seed
from fedcore.text import TextData

SCOPES = ("payload", "client_token")
MAX_SEVERITY = 5
# CIFAR-C gaussian_noise: the noise scale on [0, 1] pixels per severity 1..5.
IMAGE_NOISE = (0.0, 0.08, 0.12, 0.18, 0.26, 0.38)
WORD_DROP = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # text: token dropout probability per severity
PERSONALIZE_STREAM = 7_919  # personalization's random stream, apart from training's


@dataclass(frozen=True)
class PersonalizeConfig:
    scope: str = "payload"
    local: LocalConfig = LocalConfig(local_epochs=10)
    lr: float = 0.01
    severities: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    tune_fraction: float = 0.5
    max_clients: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ConfigError(f"personalize scope must be one of {', '.join(SCOPES)}")
        if not self.severities or any(not 0 <= s <= MAX_SEVERITY for s in self.severities):
            raise ConfigError(f"personalize severities must be 0..{MAX_SEVERITY}")
        if not 0.0 < self.tune_fraction < 1.0:
            raise ConfigError("personalize tune_fraction must be in (0, 1)")


@dataclass(frozen=True)
class ClientResult:
    client: int
    severity: int
    tune_samples: int
    test_samples: int
    accuracy_before: float
    accuracy_after: float

    @property
    def gain(self) -> float:
        return self.accuracy_after - self.accuracy_before


def scope_keys(model: nn.Module, scope: str, payload_trainable: frozenset[str]) -> frozenset[str]:
    """The parameters a client fine-tunes; ``client_token`` needs an Accumulator."""
    if scope == "payload":
        return payload_trainable
    keys = frozenset(n for n, _ in model.named_parameters() if n.endswith("client_token"))
    if not keys:
        raise ConfigError(
            "personalize scope 'client_token' needs a model with a client token "
            "(adapter accumulator); use scope 'payload'"
        )
    return keys


def corrupt(data: Any, rows: np.ndarray, severity: int, seed: int) -> Any:
    """The client's rows as a new dataset of the same kind, corrupted at ``severity``."""
    idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    gen = torch.Generator().manual_seed(seed)
    if isinstance(data, TextData):
        tokens = data.tokens.index_select(0, idx).clone()
        p = WORD_DROP[severity]
        if p > 0.0:
            for i in range(tokens.shape[0]):
                row = tokens[i]
                n = int((row != data.pad_id).sum())
                keep = torch.ones(n, dtype=torch.bool)
                if n > 2:  # never the first (CLS) or the last (SEP) token
                    keep[1:-1] = torch.rand(n - 2, generator=gen) >= p
                kept = row[:n][keep]
                row.fill_(data.pad_id)
                row[: kept.numel()] = kept
        return TextData(tokens, data.labels.index_select(0, idx).clone(), data.pad_id)
    if isinstance(data, ImageData):
        images = data.images.index_select(0, idx)
        sigma = IMAGE_NOISE[severity]
        if sigma > 0.0:
            x = images.to(torch.float32) / 255.0
            x = x + torch.randn(x.shape, generator=gen) * sigma
            images = (x.clamp_(0.0, 1.0) * 255.0).round_().to(torch.uint8)
        else:
            images = images.clone()
        out = copy.copy(data)  # the same input step (size, channels, mean, std)
        out.images, out.labels = images, data.labels.index_select(0, idx).clone()
        return out
    raise TypeError(f"cannot corrupt {type(data).__name__}")


def personalize(
    model: nn.Module,
    state: StateDict,
    data: Any,
    shards: Sequence[np.ndarray],
    trainable: frozenset[str],
    cfg: PersonalizeConfig,
    *,
    device: torch.device | str = "cpu",
    on_client: Callable[[ClientResult, StateDict], None] | None = None,
) -> list[ClientResult]:
    """Fine-tune ``state`` on every client's corrupted data; accuracy before and after.

    ``on_client(result, tuned_state)`` is called as each client finishes."""
    keys = scope_keys(model, cfg.scope, trainable)
    clients = range(len(shards) if cfg.max_clients is None else min(cfg.max_clients, len(shards)))
    results = []
    for c in clients:
        rows = np.asarray(shards[c], dtype=np.int64)
        if len(rows) < 2:
            continue  # nothing to test on
        severity = cfg.severities[c % len(cfg.severities)]
        own = corrupt(data, rows, severity, derive_seed(cfg.seed, PERSONALIZE_STREAM, c, 0))
        order = np.random.default_rng(derive_seed(cfg.seed, PERSONALIZE_STREAM, c, 1)).permutation(
            len(rows)
        )
        n_tune = min(len(rows) - 1, max(1, round(cfg.tune_fraction * len(rows))))
        tune, test = np.sort(order[:n_tune]), np.sort(order[n_tune:])
        begin_client(
            model, c, derive_seed(cfg.seed, PERSONALIZE_STREAM, c, 2)
        )  # early exits: its tier
        with fixed_exit(model, client_exit(model, c)):  # tuned and tested at the same exit
            before = _accuracy(model, state, own, test, device)
            tuned = train_locally(
                model,
                state,
                own,
                tune,
                lr=cfg.lr,
                cfg=cfg.local,
                seed=derive_seed(cfg.seed, PERSONALIZE_STREAM, c, 3),
                device=device,
                trainable=keys,
            ).state
            after = _accuracy(model, tuned, own, test, device)
        result = ClientResult(c, severity, len(tune), len(test), before, after)
        results.append(result)
        if on_client is not None:
            on_client(result, tuned)
    return results


def _accuracy(
    model: nn.Module, state: StateDict, data: Any, rows: np.ndarray, device: Any
) -> float:
    correct, _, n = evaluate(model, state, data, rows, device=device)
    return correct / n if n else 0.0


def summarize(results: Sequence[ClientResult], scope: str) -> dict[str, Any]:
    """The record a run keeps: per client and means (accuracy as fractions)."""
    before = [r.accuracy_before for r in results]
    after = [r.accuracy_after for r in results]
    return {
        "scope": scope,
        "clients": [{**asdict(r), "gain": r.gain} for r in results],
        "mean_accuracy_before": float(np.mean(before)) if results else None,
        "mean_accuracy_after": float(np.mean(after)) if results else None,
        "mean_gain": float(np.mean(after) - np.mean(before)) if results else None,
    }
