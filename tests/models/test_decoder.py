"""GPT-2 decoders for next-token prediction: the offline tokenizer and model, the tied LM
head, every adapter that applies, what trains and travels, and the hub path offline."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedcore import payload
from fedcore.errors import ConfigError
from models import get_model
from models.adapters import adapt, applicable_adapters, get_adapter
from models.decoder import DecoderLM, bpe
from models.text import is_next_token_model, text_tokenizer
from tasks.data.backbone import load_base

VOCAB, HIDDEN, LAYERS, CONTEXT = 300, 32, 2, 6
TINY = {"vocab_size": VOCAB, "layers": LAYERS, "hidden": HIDDEN, "heads": 2, "context": CONTEXT}


def tiny() -> DecoderLM:
    torch.manual_seed(0)
    return get_model("gpt2_small", num_classes=VOCAB, options=TINY)


def ids(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, CONTEXT), generator=torch.Generator().manual_seed(seed))


def test_offline_tokenizer_is_a_deterministic_bpe_of_the_held_out_plays():
    # The merges are learnt from the seven pretraining plays only; the same bytes every run.
    digest = hashlib.sha256(bpe(4096).to_str().encode()).hexdigest()
    assert digest == "4580822032b1c0efe342bac899240dbf62d27b4db135dc79c1c6f6da7f27053d"
    tok = text_tokenizer("gpt2_small")
    assert (tok.vocab_size, tok.max_length, tok.stride, tok.pad_id) == (4096, 32, 32, 0)
    assert tok.encode_stream(["To be, or not to be"]) == [[391, 305, 12, 503, 321, 288, 305]]
    assert tok.backend.decode([391, 305, 12, 503, 321, 288, 305]) == "To be, or not to be"
    assert is_next_token_model("gpt2_small") and not is_next_token_model("minilm")
    with pytest.raises(ConfigError, match=r"^model.options.vocab_size: must be greater"):
        text_tokenizer("gpt2_small", {"vocab_size": 100})


def test_default_size_and_last_position_logits():
    model = get_model("gpt2_small", num_classes=4096)
    assert sum(p.numel() for p in model.parameters()) == 1_321_728  # 4 x 128, vocab 4,096
    m = tiny()
    x = ids()
    logits = m(x)
    assert logits.shape == (3, VOCAB)
    torch.testing.assert_close(m.lm_logits(x)[:, -1], logits)  # the LM head at position n
    # Causal: the next-token logits of a prefix do not see the tokens after it.
    torch.testing.assert_close(m.lm_logits(x[:, :4])[:, -1], m.lm_logits(x)[:, 3])
    state = m.state_dict()
    assert "transformer.wte.weight" in state and not any("lm_head" in k for k in state)
    assert m.block_names() == ["transformer.h.0", "transformer.h.1"]


def test_num_classes_must_be_the_vocabulary():
    with pytest.raises(ConfigError, match=r"^model 'gpt2_small' predicts the next of its 300"):
        get_model("gpt2_small", num_classes=10, options=TINY)
    with pytest.raises(ConfigError, match=r"^model.options.hidden: must be a multiple of heads"):
        get_model("gpt2_small", num_classes=VOCAB, options={**TINY, "heads": 3})


# Trainable parameters of the tiny decoder per method (hand-computed). A GPT-2 block of width
# H: two LayerNorms 4H, c_attn H*3H + 3H, c_proj H*H + H, c_fc H*4H + 4H, mlp.c_proj 4H*H + H
# = 12 H^2 + 13 H = 12,704 for H = 32. Bottleneck m = 32 // 16 = 2: down 32*2+2, up 2*32+32
# = 162 per site. LoRA r=8 on c_attn (32 -> 96): A 8*32 + B 96*8 = 1,024 per block. head: the
# tied embedding, 300*32.
BLOCK = 12 * HIDDEN**2 + 13 * HIDDEN
EXPECTED = {
    "full": LAYERS * BLOCK + VOCAB * HIDDEN + CONTEXT * HIDDEN + 2 * HIDDEN,
    "head": VOCAB * HIDDEN,
    "houlsby": LAYERS * 2 * 162,
    "pfeiffer": LAYERS * 162,
    "parallel": LAYERS * 162,
    "lora": LAYERS * 1024,
}


def test_every_block_adapter_applies_and_only_its_payload_trains():
    assert applicable_adapters(tiny()) == sorted(EXPECTED)
    x, y = ids(8), torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(2))
    for name, trainable in EXPECTED.items():
        method = get_adapter(name)
        model = adapt(tiny(), name)
        counts = method.counts(model)
        assert counts.trainable_params == trainable, name
        keys = method.payload_keys(model)
        assert set(keys) == {n for n, p in model.named_parameters() if p.requires_grad}, name
        if name not in ("full", "head"):  # the tied LM head stays frozen with the embedding
            assert "transformer.wte.weight" not in keys
        before = copy.deepcopy(model.state_dict())
        torch.optim.SGD(model.parameters(), lr=0.5).zero_grad()
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.5 * p.grad
        after = model.state_dict()
        changed = {k for k in after if not torch.equal(after[k], before[k])}
        assert changed and changed <= set(keys), name
        assert counts.payload_bytes == len(payload.encode(method.payload(model)))


def test_full_payload_holds_the_tied_matrix_once():
    model = adapt(tiny(), "full")
    sent = get_adapter("full").payload(model)
    params = sum(p.numel() for p in model.parameters())
    assert sum(t.numel() for t in sent.values()) == params  # no second copy as lm_head.weight


def test_lora_on_gpt2_conv1d_merges_exactly():
    model = adapt(tiny(), "lora")
    assert [n for n, _ in model.named_modules() if n.endswith("c_attn")] == [
        "transformer.h.0.attn.c_attn",
        "transformer.h.1.attn.c_attn",
    ]
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.3, generator=torch.Generator().manual_seed(len(n)))
    x = ids()
    merged = get_adapter("lora").merge(model)
    assert type(merged) is DecoderLM and not any("lora" in k for k in merged.state_dict())
    assert not torch.allclose(model(x), tiny()(x))  # B A changes the outputs ...
    torch.testing.assert_close(merged(x), model(x), atol=1e-5, rtol=1e-5)  # ... merged too


def test_bottleneck_adapters_start_equal_to_the_base():
    x = ids()
    for name in ("houlsby", "pfeiffer", "parallel"):
        torch.testing.assert_close(adapt(tiny(), name)(x), tiny()(x))


def test_pretrained_base_copies_the_tied_head(tmp_path):
    base = tiny()
    with torch.no_grad():
        base.transformer.wte.weight.add_(1.0)
    path = tmp_path / "base.pt"
    path.write_bytes(payload.encode(base.state_dict()))
    fresh = tiny()
    load_base(fresh, path, "gpt2_small")  # the LM head is the embedding: copied, not reset
    assert torch.equal(fresh.transformer.wte.weight, base.transformer.wte.weight)
    torch.testing.assert_close(fresh(ids()), base(ids()))


def test_hub_decoder_offline_is_one_line(monkeypatch):
    import huggingface_hub.constants as hub
    import transformers

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # read at import: the env var is too late
    msg = r"^model 'gpt2_hf' \(gpt2\): could not load from the Hugging Face hub \(.*\); it needs"
    with pytest.raises(ConfigError, match=msg) as exc:
        get_model("gpt2_hf", num_classes=50257)
    assert "\n" not in str(exc.value) and "offline use model gpt2_small" in str(exc.value)
    with pytest.raises(ConfigError, match=msg):
        text_tokenizer("gpt2_hf")

    def hang_then_fail(*args, **kwargs):
        raise TimeoutError("read timed out")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hang_then_fail)
    with pytest.raises(ConfigError, match=r"^model 'gpt2_hf' \(distilgpt2\): .*\(read timed out\)"):
        text_tokenizer("gpt2_hf", {"hf_name": "distilgpt2"})


def test_early_exits_do_not_apply_to_a_decoder():
    for name in ("lw_linear", "lw_mlp", "accumulator", "bn_head", "residual"):
        assert get_adapter(name).applies_to(tiny()) is not None, name
    assert np.isfinite(tiny()(ids()).detach().numpy()).all()
