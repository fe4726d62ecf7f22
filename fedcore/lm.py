"""Next-token prediction data: windows of a model's tokens, one label each.

Seed 003 §4's next-word prediction "predicts the n+1th word when up to n words are entered".
fedapt's engine trains classifiers (one label per sample, logits (B, classes)), so a sample
here is a window of n token ids and its label the id of the token that follows; the classes
are the tokenizer's vocabulary and the decoder returns its LM head's logits at the window's
last position (``models/decoder.py``).

Windows come from one text stream at a time (a speaking role's lines joined by newlines,
``fedcore.shakespeare``), never across two: window k of a stream of length L covers tokens
[k s, k s + n) and its label is token k s + n, for every k with k s + n < L (n the context,
s the stride, both the model's options). A stream shorter than n + 1 tokens gives none.

Every window remembers its stream's ``group`` (the role): the ``natural`` partition puts each
role on a client of its own. Datasets of this kind are registered with ``kind="lm"``; their
``num_classes`` is set at load to the tokenizer's vocabulary size.

This module imports torch and numpy only: the tokenizer is passed in (``models.text``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from fedcore.errors import ConfigError


class StreamEncoder(Protocol):
    """What a next-token dataset's loader (:func:`load_shakespeare`) needs of a tokenizer (``models.text.LMTokenizer``)."""

    name: str
    vocab_size: int
    max_length: int  # the context n
    stride: int

    def encode_stream(self, texts: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class WindowDataset:
    """One split of a next-token dataset: token windows, next-token labels, their streams."""

    tokens: torch.Tensor  # int64 (N, n)
    labels: torch.Tensor  # int64 (N,): the token after each window
    groups: torch.Tensor  # int64 (N,): the window's stream (role), an index into group_names
    group_names: tuple[str, ...]  # every stream of the dataset, in both splits the same
    info: Any  # fedcore.datasets.DatasetInfo (kind "lm"), num_classes = vocabulary size

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: Any) -> WindowDataset:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64).reshape(-1))
        return replace(
            self, tokens=self.tokens[idx], labels=self.labels[idx], groups=self.groups[idx]
        )

    def sha256(self, rows: Any) -> str:
        """sha256 of the given rows' tokens, labels and groups (int64, in row order)."""
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64).reshape(-1))
        h = hashlib.sha256(self.tokens[idx].contiguous().numpy().tobytes())
        h.update(self.labels[idx].numpy().tobytes())
        h.update(self.groups[idx].numpy().tobytes())
        return h.hexdigest()


def windows(stream: list[int], context: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, context) windows of ``stream`` and their (k,) next tokens (module docstring)."""
    if context < 1 or stride < 1:
        raise ConfigError(f"context and stride must be >= 1 (got {context}, {stride})")
    t = torch.as_tensor(stream, dtype=torch.int64)
    if len(t) < context + 1:
        return torch.empty(0, context, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    w = t.unfold(0, context + 1, stride)  # (k, context + 1)
    return w[:, :context].contiguous(), w[:, context].contiguous()


def stream_windows(
    streams: list[str], encoder: StreamEncoder, info: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windows of every stream, in stream order: tokens (N, n), labels (N,), groups (N,)."""
    n, s = encoder.max_length, encoder.stride
    xs, ys, gs = [], [], []
    for g, ids in enumerate(encoder.encode_stream(streams)):
        x, y = windows(ids, n, s)
        xs.append(x)
        ys.append(y)
        gs.append(torch.full((len(y),), g, dtype=torch.int64))
    tokens = torch.cat(xs) if xs else torch.empty(0, n, dtype=torch.int64)
    labels = torch.cat(ys) if ys else torch.empty(0, dtype=torch.int64)
    if len(labels) and int(torch.maximum(tokens.max(), labels.max())) >= encoder.vocab_size:
        raise ConfigError(
            f"tokenizer {encoder.name!r} gave ids beyond its vocabulary of {encoder.vocab_size}"
        )
    return tokens, labels, torch.cat(gs) if gs else torch.empty(0, dtype=torch.int64)


def check_encoder(info: Any, encoder: StreamEncoder | None) -> StreamEncoder:
    """A next-token dataset is loaded with its decoder's tokenizer: one line without one."""
    if encoder is None or not callable(getattr(encoder, "encode_stream", None)):
        raise ConfigError(
            f"dataset {info.name!r} is next-token prediction over a decoder's tokens: it is "
            f"loaded with that model's tokenizer (model.name: gpt2_small or gpt2_hf)"
        )
    return encoder


def load_shakespeare(info: Any, split: str, encoder: StreamEncoder | None) -> WindowDataset:
    """One split of ``shakespeare`` in ``encoder``'s tokens, a client per speaking role (its
    loader in ``fedcore.datasets.DATASETS``)."""
    encoder = check_encoder(info, encoder)
    from fedcore.shakespeare import read_corpus

    roles = read_corpus().roles
    streams = ["\n".join(r.split(split)) for r in roles]
    tokens, labels, groups = stream_windows(streams, encoder, info)
    info = replace(info, num_classes=int(encoder.vocab_size))
    return WindowDataset(tokens, labels, groups, tuple(r.key for r in roles), info)
