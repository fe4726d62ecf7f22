"""Text backbones: their tokenizers, and the per-block CLS-token plumbing of encoders.

**Tokenizers.** A text backbone (``minilm``, ``text_hf``) is registered with
:func:`register_text_model`, which names the function that builds its tokenizer from the
model's options. The data pipeline asks :func:`text_tokenizer` for it, so the ids a model is
trained on always come from that model's own tokenizer; a tokenizer whose vocabulary or pad id
does not fit the model's embedding stops with one line (:func:`check_tokenizer`). Tokenizers are
Hugging Face ``tokenizers`` (Rust) objects: the offline MiniLM reads its ``tokenizer.json``
without importing ``transformers`` (8 s here).

**CLS plumbing (for the Accumulator of seed 001 and the layer-wise heads).** Every encoder
classifier in fedapt exposes the same attributes, whatever its family:

* ``blocks``: the transformer blocks in forward order, an ``nn.ModuleList`` or
  ``nn.Sequential`` (BERT-style: ``bert.encoder.layer``, 6 ``BertLayer`` in MiniLM; ViT-style
  (timm): ``blocks``, 12 ``Block`` in ViT/DeiT-small, so a timm model works as it is, with
  ``embed_dim`` as its width); ``block_names()`` their module names;
* ``hidden_size`` (384 for MiniLM and ViT/DeiT-small) and ``cls_index`` (0: BERT's [CLS] and
  ViT's class token both sit at position 0; DeiT's distillation token, where present, at 1);
* each block maps (B, T, H) -> (B, T, H) (BERT blocks take the extended attention mask as
  well; a block returning a tuple has the hidden states first).

:func:`cls_states` runs the model once with forward hooks on ``blocks`` and returns the CLS
hidden state after every block, (B, num_blocks, H): the "history of CLS tokens" the
Accumulator attends over. It works unchanged under ``torch.func.functional_call`` (hooks fire
on the submodules), so the engine's one-module-many-clients design keeps working. Note the
last entry is *before* the encoder's final norm in ViT (timm applies ``norm`` after the
blocks) and *after* it in BERT (post-LN: every BertLayer ends in a LayerNorm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from fedcore.errors import ConfigError
from fedcore.options import dump
from fedcore.protocols import cls_blocks, cls_index
from models.registry import MODELS, builder, parse_model_options


@dataclass
class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with what fedapt needs: ids with special tokens, truncation
    counted, the pad id and the vocabulary size."""

    name: str
    backend: Any  # tokenizers.Tokenizer
    pad_id: int
    vocab_size: int
    max_length: int = 64  # the model's ``max_length`` option: texts are cut to this many ids

    def encode(self, texts: list[str], max_length: int) -> tuple[list[list[int]], int]:
        """Ids per text ([CLS] ... [SEP] for BERT, at most ``max_length``) and how many texts
        were truncated to fit."""
        self.backend.no_padding()
        self.backend.enable_truncation(max_length)  # special tokens are kept within the limit
        encodings = self.backend.encode_batch(texts)
        truncated = sum(1 for e in encodings if e.overflowing)
        return [e.ids for e in encodings], truncated


@dataclass
class LMTokenizer(TextTokenizer):
    """The tokenizer of a next-token decoder: ``max_length`` is the window's context (n
    tokens in, the n+1th predicted) and ``stride`` the step between windows
    (``fedcore.lm``); ``pad_id`` is the end-of-text id (windows are never padded)."""

    stride: int = 1

    def encode_stream(self, texts: list[str]) -> list[list[int]]:
        """Ids per text: no special tokens, no truncation (a role's whole stream)."""
        self.backend.no_padding()
        self.backend.no_truncation()
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings]


def from_backend(
    name: str, backend: Any, max_length: int, pad_token: str = "[PAD]"
) -> TextTokenizer:
    pad_id = backend.token_to_id(pad_token)
    if pad_id is None:
        raise ConfigError(f"tokenizer of {name!r} has no pad token {pad_token!r}")
    return TextTokenizer(name, backend, int(pad_id), int(backend.get_vocab_size()), max_length)


def text_models() -> list[str]:
    return sorted(n for n, e in MODELS.items() if e.task != "image")


def is_text_model(name: str) -> bool:
    return name in MODELS and MODELS[name].task != "image"


def is_next_token_model(name: str) -> bool:
    """A decoder predicting the next token (``gpt2_small``, ``gpt2_hf``)."""
    return name in MODELS and MODELS[name].task == "next_token"


def next_token_models() -> list[str]:
    return sorted(n for n, e in MODELS.items() if e.task == "next_token")


def text_tokenizer(name: str, options: Any = None, **kw: Any) -> TextTokenizer:
    """The tokenizer of text backbone ``name`` with these model options (validated as
    ``models.registry.get_model`` validates them: ``options`` a mapping or typed instance,
    ``kw`` on top)."""
    if not is_text_model(name):
        raise ConfigError(
            f"model {name!r} takes images, not text; text models: {', '.join(text_models())}"
        )
    tokenizer = builder(name).tokenizer  # type: ignore[attr-defined]
    typed = parse_model_options(name, options, **kw)
    return cast(TextTokenizer, tokenizer(**dump(typed)))


def check_tokenizer(tokenizer: TextTokenizer, vocab_size: int, pad_id: int | None) -> None:
    """A tokenizer that does not fit the model's embedding -> one line, before any training."""
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(
            f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens but the model "
            f"embeds {vocab_size}: tokenizer and model do not match"
        )
    if pad_id is not None and tokenizer.pad_id != pad_id:
        raise ConfigError(
            f"tokenizer {tokenizer.name!r} pads with id {tokenizer.pad_id}, the model with "
            f"{pad_id}: tokenizer and model do not match"
        )


def cls_states(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, num_blocks, H): the CLS hidden state after each of ``model.blocks`` (module docstring)."""
    blocks = cls_blocks(model)  # ModuleList (BERT) or Sequential (timm ViT)
    if blocks is None:
        raise ConfigError(f"{type(model).__name__} has no ``blocks`` list of transformer blocks")
    cls = cls_index(model)
    states: list[torch.Tensor] = []

    def grab(module: nn.Module, args: Any, out: Any) -> None:
        hidden = out[0] if isinstance(out, tuple) else out  # (B, T, H)
        states.append(hidden[:, cls])

    handles = [b.register_forward_hook(grab) for b in blocks]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(states, dim=1)
