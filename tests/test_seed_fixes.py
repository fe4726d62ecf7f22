"""Issue 18's audit fixes, each against its paper (the seeds are the spec): tests that fail
on the code before the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.adapters import adapt

# ---- 5. Gaussian feature noise (seed 000 §IV: clients C_1..C_N) ----------------------------


def test_gaussian_noise_clients_are_c1_to_cn_and_batches_have_that_variance():
    import numpy as np

    from fedcore.partition import make_partition
    from tests.helpers import toy_data

    labels = np.tile(np.arange(2), 250)
    part = make_partition("gaussian_noise", labels, num_clients=5, seed=0, sigma=0.5)
    # C_i of N gets variance sigma * i / N, i = 1..N: the last client gets sigma, none is clean
    assert part.noise_var == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5))
    data = toy_data(500, size=12)
    for k in (0, 4):
        idx = torch.as_tensor(part.client_indices[k], dtype=torch.int64)  # 100 images
        clean, _ = data.batch(idx)
        gen = torch.Generator().manual_seed(k)
        noisy, _ = data.batch(idx, noise_var=part.noise_var[k], generator=gen)
        # sample variance of 14,400 draws: relative std sqrt(2 / n) ~ 1.2%
        assert float((noisy - clean).var()) == pytest.approx(0.5 * (k + 1) / 5, rel=0.05)


# ---- 6. Exponential schedule (seed 004 §6.1.4) --------------------------------------------


def test_exponential_schedule_t_is_rounds_elapsed():
    """eta_t = eta_0 0.998^t; SGD "starts with an initial learning rate of 0.01": round 1
    trains at eta_0, round r at eta_0 0.998^(r - 1), as ExponentialLR stepped per round."""
    from fedcore.schedules import LRSchedule

    sched = LRSchedule(kind="exponential", lr=0.01)  # decay 0.998 by default (the paper's)
    assert sched.decay == 0.998
    assert sched.at(1) == 0.01
    assert sched.at(2) == pytest.approx(0.01 * 0.998)
    assert sched.at(2000) == pytest.approx(0.01 * 0.998**1999)  # the paper's round cap
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.01)
    torch_sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.998)
    for r in range(1, 6):
        assert sched.at(r) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        opt.step()
        torch_sched.step()


# ---- strengthened tests the audit found weak ------------------------------------------------


def test_classwise_dirichlet_balancing_closes_full_clients():
    """NIID-Bench labeldir balancing: before class k is cut, a client already holding >= n/N
    samples gets no share of class k; with a small beta that happens, so it is exercised."""
    import numpy as np

    from fedcore.partition import make_partition

    labels = np.repeat(np.arange(10), 100)  # n = 1000, N = 5: a client closes at >= 200
    closures = 0
    for seed in range(10):
        p = make_partition("dirichlet_classwise", labels, num_clients=5, seed=seed, beta=0.1)
        counts = p.label_counts(labels, 10)  # (clients, classes)
        before = np.cumsum(counts, axis=1) - counts  # each client's size before class k
        closed = before >= 1000 / 5
        assert (counts[closed] == 0).all(), seed  # a closed client gets nothing of class k
        closures += int(closed.sum())
        # so no client grows past n/N + one class (100) minus one sample
        assert p.sizes().max() < 200 + 100
    assert closures > 0  # the balancing step did close clients


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
