"""GPT-2-style decoders for next-token prediction (seed 003 §4: gpt2-base on Shakespeare).

A sample is a window of ``context`` token ids and its label the id of the token that follows
(``fedcore.lm``); the model returns the LM head's logits at the window's last position,
(B, vocab), so the engine trains and scores it as a classifier over the vocabulary:
cross-entropy on the next token, accuracy = next-token accuracy.

* ``gpt2_small`` (offline): a GPT-2 of ``layers`` blocks, ``hidden`` wide (default 4 x 128,
  4 heads, 1,321,728 parameters with its 4,096-token vocabulary), built with transformers'
  ``GPT2Model`` from random weights; ``model.base: pretrain`` trains it first on the plays held
  out of the federation (``tasks/data/pretrain_lm.py``). Its tokenizer is a byte-level BPE (GPT-2's
  scheme) of ``vocab_size`` tokens trained by ``tokenizers`` on the same held-out plays, so it
  never saw the federation's text either; the training is deterministic (the same merges
  every time: ``tests/test_decoder.py`` pins its hash) and takes about 2 s, once per process.
* ``gpt2_hf`` (online): a GPT-2 from the Hugging Face hub (``hf_name``, default ``gpt2``: the
  seed's gpt2-base, 124M parameters) with its own 50,257-token BPE, downloaded once into the HF
  cache. Offline it stops with one line, as ``text_hf`` does.

"Word" in seed 003's next-word prediction is one token of the model's tokenizer (GPT-2 BPE),
as in Nguyen et al. (its ref. [7]) whose gpt2 runs it reproduces: a whole word would take
several decoding steps, and the seed's gpt2 predicts tokens.

The LM head is GPT-2's: logits = h W_e^T with W_e the input embedding (weights tied, as in
GPT-2), held once as ``transformer.wte.weight`` (one state-dict entry, so it travels once). It
is the model's ``classifier_name``; what the adapter methods do with it is in
``models/adapters/base.py`` (``adapter_head``): ``head`` trains it (and so the input
embedding), ``houlsby`` / ``pfeiffer`` / ``lora`` leave it frozen with the embedding (seed 003
§3 freezes "the embedding and transformer layers"; its Table 12 adapter sizes hold no head).

No dropout (the cohort engine's vmapped steps cannot draw per-client masks), as for MiniLM.
Layout for adapters: ``blocks`` = ``transformer.h``, each ``GPT2Block`` with ``attn.c_attn``
(fused query/key/value, a transformers ``Conv1D``), ``attn.c_proj``, ``mlp.c_fc`` and
``mlp.c_proj``.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

import torch
from annotated_types import Ge, Le
from torch import nn
from torch.nn import functional as F

from fedcore.errors import ConfigError
from fedcore.options import Int
from models.registry import backbone
from models.text import LMTokenizer

EOS = "<|endoftext|>"  # GPT-2's one special token (also the pad id: windows are never padded)
Context = Annotated[Int, Ge(1), Le(1024)]  # window length (GPT-2's 1,024 positions at most)
Stride = Annotated[Int, Ge(1)]
# Plain matmul attention: the cohort engine's vmap batches it natively, while torch has no
# batching rule for CPU flash attention (a per-sample fallback); at 32 positions it is as fast.
ATTENTION = "eager"


class DecoderLM(nn.Module):
    """A GPT-2 (``transformers.GPT2Model``) and its tied LM head at the last position."""

    classifier_name = "transformer.wte"  # the LM head is the input embedding (tied)
    is_decoder = True

    def __init__(self, transformer: nn.Module, *, context: int) -> None:
        super().__init__()
        self.transformer = transformer  # keys transformer.wte, .wpe, .h.{i}, .ln_f
        config: Any = transformer.config
        self.hidden_size = int(config.n_embd)
        self.vocab_size = int(config.vocab_size)
        self.context = context

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h  # type: ignore[return-value]

    def block_names(self) -> list[str]:
        return [f"transformer.h.{i}" for i in range(len(self.blocks))]

    def layer_groups(self) -> list[list[str]]:
        """Embeddings (the tied head among them), each block, the final LayerNorm."""
        return [
            ["transformer.wte", "transformer.wpe"],
            *[[n] for n in self.block_names()],
            ["transformer.ln_f"],
        ]

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, H) final hidden states (after ``ln_f``); causal attention."""
        return self.transformer(input_ids=input_ids).last_hidden_state

    def head_weight(self) -> torch.Tensor:
        """(vocab, H): the LM head's weight, which is the input embedding's (tied)."""
        wte: Any = self.transformer.wte
        return wte.weight

    def lm_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T, vocab): the next-token logits at every position (the pretrain stage)."""
        return F.linear(self.hidden(input_ids), self.head_weight())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        last = self.hidden(input_ids)[:, -1]  # (B, H): the window's last position
        return F.linear(last, self.head_weight())  # (B, vocab)


def _check_classes(name: str, num_classes: int, vocab: int) -> None:
    if num_classes != vocab:
        raise ConfigError(
            f"model {name!r} predicts the next of its {vocab} tokens: num_classes must be "
            f"{vocab} (got {num_classes}); next-token datasets: shakespeare"
        )


def _no_dropout(config: Any) -> Any:
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return config


# ---- gpt2_small (offline) -------------------------------------------------------------------
def bpe(vocab_size: int) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens trained on the pretraining plays: trained
    once per process, a fresh tokenizer per call (its settings are its user's)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_bpe_json(vocab_size))


@cache
def _bpe_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from fedcore.shakespeare import read_corpus

    texts = ["\n".join(lines) for lines in read_corpus().pretrain_lines]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:  # too few merges in the text for this many tokens
        raise ConfigError(
            f"model.options.vocab_size: the pretraining plays give only {tok.get_vocab_size()} "
            f"BPE tokens (got {vocab_size}); use at most {tok.get_vocab_size()}"
        )
    return str(tok.to_str())


def small_tokenizer(
    *,
    context: int = 32,
    stride: int = 32,
    vocab_size: int = 4096,
    layers: int = 4,
    hidden: int = 128,
    heads: int = 4,
) -> LMTokenizer:
    backend = bpe(vocab_size)
    eos = int(backend.token_to_id(EOS))
    return LMTokenizer(f"gpt2_small-bpe{vocab_size}", backend, eos, vocab_size, context, stride)


@backbone(tokenizer=small_tokenizer)
def gpt2_small(
    *,
    num_classes: int,
    in_channels: int = 1,
    input_size: int = 1,
    context: Context = 32,
    stride: Stride = 32,
    vocab_size: Annotated[Int, Ge(257), Le(65536)] = 4096,  # 256 bytes + <|endoftext|> at least
    layers: Annotated[Int, Ge(1)] = 4,
    hidden: Annotated[Int, Ge(8)] = 128,
    heads: Annotated[Int, Ge(1)] = 4,
) -> nn.Module:
    """A small GPT-2 from random weights (``model.base: pretrain`` trains it first)."""
    from transformers import GPT2Config, GPT2Model

    _check_classes("gpt2_small", num_classes, vocab_size)
    if hidden % heads:
        raise ConfigError(
            f"model.options.hidden: must be a multiple of heads {heads} (got {hidden})"
        )
    config = GPT2Config(  # type: ignore[call-arg]  # attn_implementation: a config kwarg
        activation_function="gelu_pytorch_tanh",  # GPT-2's tanh GELU as one fused op
        attn_implementation=ATTENTION,
        vocab_size=vocab_size,
        n_positions=context,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        bos_token_id=0,  # <|endoftext|> is the BPE's first token
        eos_token_id=0,
    )
    return DecoderLM(GPT2Model(_no_dropout(config)), context=context)


# ---- gpt2_hf (online) ---------------------------------------------------------------------
def _hf_error(hf_name: str, exc: BaseException) -> ConfigError:
    reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return ConfigError(
        f"model 'gpt2_hf' ({hf_name}): could not load from the Hugging Face hub ({reason}); it "
        f"needs internet once (then cached in ~/.cache/huggingface); offline use model "
        f"gpt2_small with model.base: pretrain"
    )


def hf_tokenizer(*, hf_name: str = "gpt2", context: int = 32, stride: int = 32) -> LMTokenizer:
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(hf_name)
    except Exception as exc:  # OSError offline, HTTP errors, timeouts
        raise _hf_error(hf_name, exc) from None
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or tok.eos_token_id is None:
        raise ConfigError(f"model 'gpt2_hf' ({hf_name}): needs a fast tokenizer with an EOS token")
    vocab = int(backend.get_vocab_size())
    return LMTokenizer(hf_name, backend, int(tok.eos_token_id), vocab, context, stride)


@backbone(tokenizer=hf_tokenizer)
def gpt2_hf(
    *,
    num_classes: int,
    in_channels: int = 1,
    input_size: int = 1,
    hf_name: str = "gpt2",
    context: Context = 32,
    stride: Stride = 32,
) -> nn.Module:
    """A pretrained GPT-2 from the Hugging Face hub (downloaded once), e.g. seed 003's gpt2."""
    try:
        from transformers import GPT2Config, GPT2Model

        config = _no_dropout(GPT2Config.from_pretrained(hf_name))
        transformer = GPT2Model.from_pretrained(
            hf_name, config=config, attn_implementation=ATTENTION
        )
    except Exception as exc:
        raise _hf_error(hf_name, exc) from None
    _check_classes("gpt2_hf", num_classes, int(config.vocab_size))
    if context > int(config.n_positions):
        raise ConfigError(
            f"model.options.context: {hf_name} has {config.n_positions} positions (got {context})"
        )
    return DecoderLM(transformer, context=context)
