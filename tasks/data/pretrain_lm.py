"""The pretrain stage for a next-token decoder (``model.base: pretrain`` with ``gpt2_small``).

Seed 003 fine-tunes a *pretrained* gpt2 in FL; offline there are no GPT-2 weights, so fedapt
pretrains its small GPT-2 on text the federation never sees: the plays held out of the
federation (``fedcore.shakespeare``: seven plays, about 254k tokens of the 4,096-token BPE),
the same text the decoder's tokenizer was trained on.

Causal language modelling, as GPT-2 was trained: each play's lines (joined by newlines) are
cut into blocks of ``context + 1`` tokens (stride ``context``; ``pretrain.max_samples`` caps
their number, a seeded subset), and the loss is the cross-entropy of the next token at every
position of every block (``DecoderLM.lm_logits``). AdamW (``pretrain.momentum`` is its beta1,
beta2 0.999, decoupled ``pretrain.weight_decay``), ``pretrain.lr`` with a linear warm-up over
the first 5% of the steps and a cosine decay to a tenth of it; ``pretrain.epochs`` passes in
a seeded order, ``pretrain.batch_size`` blocks per step. After each epoch the base is scored
like the federation scores it: next-token accuracy on the federation's test windows (scored
only, never trained on). The outputs are those of the image stage (``tasks/data/pretrain.py``).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from fedcore import payload
from fedcore.errors import ConfigError
from fedcore.lm import windows
from fedcore.shakespeare import read_corpus
from models import get_model
from tasks.data.backbone import BASE_FILE, backbone_options
from tasks.config import Params
from tasks.data.experiment import ExperimentData
from tasks.io import atomic_write_bytes, atomic_write_json

_SOURCE_STREAM = 11  # as tasks.data.pretrain: the seed stream of the source subset
MAX_LR = 0.01  # above this AdamW diverges on these models (pretrain.lr's 0.05 is SGD's)
WARMUP = 0.05  # of the steps
EVAL_BATCH = 256


def check_source(params: Params) -> None:
    """A pretrain configuration the decoder's stage cannot honour -> one line."""
    p, d = params.pretrain, params.data
    if p.dataset not in (None, d.dataset):
        raise ConfigError(
            f"pretrain.dataset: a decoder pretrains on the plays held out of {d.dataset} "
            f"(set pretrain.dataset: null, got {p.dataset!r})"
        )
    if p.classes is not None:
        raise ConfigError(
            "pretrain.classes: a decoder's classes are its tokens; set pretrain.classes: null"
        )
    if p.lr > MAX_LR:
        raise ConfigError(
            f"pretrain.lr: the decoder pretrains with AdamW, which diverges at {p.lr:g} (the SGD "
            f"default); use at most {MAX_LR:g}, e.g. --set pretrain.lr=0.003"
        )


def source_blocks(params: Params, tokenizer: Any) -> tuple[torch.Tensor, tuple[str, ...]]:
    """(N, context + 1) token blocks of the held-out plays, and the plays' titles."""
    check_source(params)
    corpus = read_corpus()
    n = tokenizer.max_length
    streams = tokenizer.encode_stream(["\n".join(lines) for lines in corpus.pretrain_lines])
    parts = []
    for ids in streams:
        x, y = windows(ids, n, n)  # block = window + its next token
        parts.append(torch.cat([x, y[:, None]], dim=1))
    blocks = torch.cat(parts)
    m = params.pretrain.max_samples
    if m is not None and m < len(blocks):
        seq = np.random.SeedSequence([params.experiment.seed, _SOURCE_STREAM])
        rows = np.sort(np.random.default_rng(seq).choice(len(blocks), m, replace=False))
        blocks = blocks[torch.as_tensor(rows)]
    if len(blocks) == 0:
        raise ConfigError(f"pretrain: the held-out plays give no block of {n + 1} tokens")
    return blocks, corpus.pretrain_plays


def _lr_at(step: int, total: int, lr: float) -> float:
    warm = max(1, round(WARMUP * total))
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def next_token_accuracy(
    model: Any, tokens: torch.Tensor, labels: torch.Tensor
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of the model's next-token prediction on windows."""
    model.eval()
    correct, loss, n = 0, 0.0, len(labels)
    for i in range(0, n, EVAL_BATCH):
        logits = model(tokens[i : i + EVAL_BATCH])  # (B, vocab)
        y = labels[i : i + EVAL_BATCH]
        correct += int((logits.argmax(dim=1) == y).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
    return correct / max(n, 1), loss / max(n, 1)


def train_decoder_base(
    params: Params, out_dir: str | Path, fingerprint: str, data: ExperimentData
) -> dict[str, Any]:
    """Pretrain the decoder on the held-out plays; write base.pt and base.json; the card."""
    p = params.pretrain
    tokenizer = data.tokenizer
    blocks, plays = source_blocks(params, tokenizer)
    torch.manual_seed(params.experiment.seed)
    model = get_model(
        params.model.name,
        num_classes=tokenizer.vocab_size,
        options=backbone_options(params),
    )
    opt = torch.optim.AdamW(
        model.parameters(), lr=p.lr, betas=(p.momentum, 0.999), weight_decay=p.weight_decay
    )
    order = torch.Generator().manual_seed(params.experiment.seed * 1000 + _SOURCE_STREAM)
    steps_per_epoch = math.ceil(len(blocks) / p.batch_size)
    total, step = p.epochs * steps_per_epoch, 0
    test_idx = torch.as_tensor(data.test_idx)
    test_x, test_y = data.test.tokens[test_idx], data.test.labels[test_idx]
    epochs = []
    for epoch in range(p.epochs):
        model.train()
        perm = torch.randperm(len(blocks), generator=order)
        loss_sum, seen = 0.0, 0
        for i in range(0, len(blocks), p.batch_size):
            b = blocks[perm[i : i + p.batch_size]]  # (B, context + 1)
            logits = model.lm_logits(b[:, :-1])  # (B, context, vocab)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, total, p.lr)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            loss_sum += loss.item() * len(b)
            seen += len(b)
        accuracy, test_loss = next_token_accuracy(model, test_x, test_y)
        epochs.append(
            {
                "epoch": epoch + 1,
                "train_loss": round(loss_sum / seen, 6),
                "test_accuracy": round(accuracy, 6),
                "test_loss": round(test_loss, 6),
            }
        )
    blob = payload.encode(model.state_dict())
    out = Path(out_dir)
    atomic_write_bytes(out / BASE_FILE, blob)
    card = {
        "used": True,
        "fingerprint": fingerprint,
        "model": params.model.name,
        "context": tokenizer.max_length,
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size},
        "source": {
            "dataset": f"{params.data.dataset} (plays held out of the federation)",
            "plays": list(plays),
            "rows": int(len(blocks)),
            "tokens": int(blocks.numel()),
            "classes": "all",
            "disjoint_from_fl_rows": True,
            "sha256": hashlib.sha256(blocks.contiguous().numpy().tobytes()).hexdigest(),
            "test_rows": int(len(test_idx)),
        },
        "epochs": epochs,
        "final_test_accuracy": epochs[-1]["test_accuracy"],
        "base_bytes": len(blob),
        "base_sha256": hashlib.sha256(blob).hexdigest(),
    }
    atomic_write_json(out / "base.json", card)
    return card
