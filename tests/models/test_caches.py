"""What a process reads once is never handed out to be changed (issue 47): the packaged
weights and tokenizers come back as a copy of their own per call."""

from __future__ import annotations

import torch


def test_packaged_weights_are_a_copy_per_call():
    from models.efficientnet import imagenet_state
    from models.minilm import minilm_state

    for read in (imagenet_state, minilm_state):
        first = read()
        key = next(k for k, v in first.items() if v.is_floating_point())
        before = first[key].clone()
        first[key].add_(1.0)  # a caller that changes what it got
        first.pop(key)
        again = read()
        assert torch.equal(again[key], before), read.__name__


def test_tokenizers_are_fresh_per_call():
    from models.decoder import bpe
    from models.minilm import minilm_tokenizer_backend

    a, b = bpe(512), bpe(512)
    assert a is not b and a.to_str() == b.to_str()
    a.enable_truncation(3)  # a user's setting stays with its tokenizer
    assert b.truncation is None and bpe(512).truncation is None
    m = minilm_tokenizer_backend()
    m.enable_truncation(5)
    fresh = minilm_tokenizer_backend()
    assert fresh is not m and fresh.truncation != m.truncation
