"""Issue 18's audit fixes, each against its paper (the seeds are the spec): tests that fail
on the code before the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.adapters import adapt

# ---- strengthened tests the audit found weak ------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_pfeiffer_adapter_sits_after_the_ffn_output_only(kind):
    """Pfeiffer (AdapterFusion, seed 003 [15]): one adapter per block after the feed-forward
    output projection; nothing after the attention output (Houlsby has both)."""
    from models.adapters.bottleneck import SequentialAdapter
    from tests.test_lora import tiny_bert, tiny_vit

    torch.manual_seed(0)
    model = adapt({"bert": tiny_bert, "vit": tiny_vit}[kind](), "pfeiffer", kind)
    sites = [n for n, m in model.named_modules() if isinstance(m, SequentialAdapter)]
    ffn_out = {"bert": "output.dense", "vit": "mlp.fc2"}[kind]
    prefix = {"bert": "bert.encoder.layer", "vit": "blocks"}[kind]
    assert sites == [f"{prefix}.{i}.{ffn_out}" for i in range(2)]
    for block in model.blocks:
        attn_out = {"bert": "attention.output.dense", "vit": "attn.proj"}[kind]
        assert isinstance(block.get_submodule(attn_out), nn.Linear)
    # the adapter reads the FFN output projection's output y and adds to it: y + A(y)
    site = model.get_submodule(sites[0])
    with torch.no_grad():
        for p in site.adapter.parameters():
            p.copy_(torch.randn(p.shape) * 0.1)
        x = torch.randn(3, site.base.in_features)
        y = site.base(x)
        assert torch.allclose(site(x), y + site.adapter(y))
        assert not torch.allclose(site(x), y)
