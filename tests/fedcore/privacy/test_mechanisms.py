"""fedcore.privacy.mechanisms: clipping bounds, noise statistics, seeding, adaptive clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcore.errors import ConfigError
from fedcore.privacy import mechanisms as dp


def make_updates(n: int, *, dtype=torch.float32, seed: int = 0) -> dict[int, dict]:
    g = torch.Generator().manual_seed(seed)
    return {
        cid: {
            "fc.weight": torch.randn(8, 5, generator=g, dtype=dtype) * (cid + 1) * 0.3,
            "fc.bias": torch.randn(8, generator=g, dtype=dtype) * (cid + 1) * 0.3,
        }
        for cid in range(n)
    }


def as_bytes(update: dict) -> bytes:
    return b"".join(update[k].numpy().tobytes() for k in sorted(update))


def test_global_norm_and_clip_by_hand():
    u = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}
    assert dp.global_norm(u) == 5.0
    clipped, norm = dp.clip_update(u, 1.0)
    assert norm == 5.0
    assert torch.equal(clipped["a"], torch.tensor([0.6, 0.0]))
    assert torch.equal(clipped["b"], torch.tensor([[0.8]]))
    same, _ = dp.clip_update(u, 10.0)  # within the norm: unchanged values, new tensors
    assert torch.equal(same["a"], u["a"]) and same["a"] is not u["a"]
    assert u["a"].tolist() == [3.0, 0.0]  # the caller's tensors are untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("clip", [0.05, 0.5, 3.0])
def test_clipping_bounds_every_clients_contribution(dtype, clip):
    updates = make_updates(6, dtype=dtype)
    before = {c: {k: t.clone() for k, t in u.items()} for c, u in updates.items()}
    kw = dict(clip_norm=clip, noise_multiplier=0.0, expected_cohort=6, seed=1, round_=3)
    full = dp.dp_fedavg(updates, **kw)
    assert all(t.dtype == dtype for t in full.mean.values())
    for cid, u in updates.items():
        norm = dp.global_norm(dp.clip_update(u, clip)[0])
        assert norm <= clip * (1 + 1e-6)
        # removing one client moves the mean by at most C / m
        rest = dp.dp_fedavg({c: v for c, v in updates.items() if c != cid}, **kw).mean
        diff = {k: full.mean[k] - rest[k] for k in rest}
        assert dp.global_norm(diff) <= clip / 6 * (1 + 1e-5)
        assert all(torch.equal(u[k], before[cid][k]) for k in u)  # no in-place edits
    assert full.clipped == sum(n > clip for n in full.norms.values())


def test_central_noise_std_is_z_c_and_reproducible():
    z, clip, m = 1.3, 0.7, 20
    zeros = {"w": torch.zeros(400, 500), "b": torch.zeros(1000, dtype=torch.float64)}
    kw = dict(noise_multiplier=z, clip_norm=clip, expected_cohort=m, seed=7, round_=4)
    noisy = dp.noisy_mean(zeros, **kw)
    for name in zeros:
        sample = noisy[name].to(torch.float64) * m  # the noise on the sum
        assert noisy[name].dtype == zeros[name].dtype
        tol = 4 * z * clip / math.sqrt(2 * sample.numel())  # 4 standard errors of the std
        assert float(sample.std()) == pytest.approx(z * clip, abs=tol)
        assert abs(float(sample.mean())) < 4 * z * clip / math.sqrt(sample.numel())
    again = dp.noisy_mean({k: v.clone() for k, v in reversed(zeros.items())}, **kw)
    assert as_bytes(again) == as_bytes(noisy)  # same bytes, whatever the entry order
    only_b = dp.noisy_mean({"b": zeros["b"]}, **kw)  # an entry's noise ignores the others
    assert torch.equal(only_b["b"], noisy["b"])
    other_round = dp.noisy_mean(zeros, **{**kw, "round_": 5})
    other_seed = dp.noisy_mean(zeros, **{**kw, "seed": 8})
    assert not torch.equal(other_round["w"], noisy["w"])
    assert not torch.equal(other_seed["w"], noisy["w"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_updates_leaves_its_inputs_alone(dtype):
    updates = make_updates(3, dtype=dtype)
    before = {c: {k: t.clone() for k, t in u.items()} for c, u in updates.items()}
    total = dp.sum_updates(updates)
    assert all(t.dtype == dtype for t in total.values())
    want = sum(u["fc.bias"].to(torch.float64) for u in before.values())
    assert torch.equal(total["fc.bias"], want.to(dtype))
    assert all(torch.equal(updates[c][k], before[c][k]) for c in updates for k in updates[c])


def test_dp_fedavg_ignores_client_order():
    updates = make_updates(5)
    kw = dict(clip_norm=0.5, noise_multiplier=1.0, expected_cohort=5, seed=3, round_=2)
    forward = dp.dp_fedavg(updates, **kw)
    backward = dp.dp_fedavg(dict(reversed(list(updates.items()))), **kw)
    assert as_bytes(forward.mean) == as_bytes(backward.mean)
    assert forward.norms == backward.norms


def test_local_noise_per_client_stream():
    zeros = {"w": torch.zeros(200_000, dtype=torch.float64)}
    kw = dict(noise_multiplier=0.5, clip_norm=2.0, seed=1, round_=1)
    a = dp.add_local_noise(zeros, client=0, **kw)
    b = dp.add_local_noise(zeros, client=1, **kw)
    assert float(a["w"].std()) == pytest.approx(1.0, rel=0.01)
    assert not torch.equal(a["w"], b["w"])
    assert torch.equal(a["w"], dp.add_local_noise(zeros, client=0, **kw)["w"])
    assert float(zeros["w"].abs().sum()) == 0.0
    # the central stream of the same (seed, round) is another stream
    central = dp.gaussian_noise(zeros, 1.0, seed=1, round_=1, tag=dp.CENTRAL)
    assert not torch.equal(central["w"], a["w"])


def test_split_noise_multiplier_spends_the_same_budget():
    z, sigma_b = 1.0, 2.0
    z_delta = dp.split_noise_multiplier(z, sigma_b)
    assert z_delta > z  # the update sum gets more noise, the count takes the rest
    assert z_delta**-2 + (2 * sigma_b) ** -2 == pytest.approx(z**-2)
    assert dp.split_noise_multiplier(0.0, 1.0) == 0.0


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
def test_adaptive_clip_moves_to_the_quantile(quantile):
    rng = np.random.default_rng(0)
    cfg = dp.AdaptiveClipConfig(
        initial_clip=0.01, target_quantile=quantile, learning_rate=0.2, count_stddev=0.5
    )
    clip = dp.AdaptiveClip(cfg)
    m = 50
    path = []
    for r in range(1, 301):
        norms = dict(enumerate(rng.lognormal(0.0, 0.5, size=m)))  # the quantile of log-normal
        path.append(clip.update(norms, expected_cohort=m, seed=0, round_=r))
    want = math.exp(0.5 * float(torch.special.ndtri(torch.tensor(quantile))))
    assert path[0] > 0.01  # all norms above C: it grows
    assert np.median(path[-100:]) == pytest.approx(want, rel=0.1)

    state = clip.state_dict()
    resumed = dp.AdaptiveClip(cfg)
    resumed.load_state_dict(state)
    norms = dict(enumerate(rng.lognormal(0.0, 0.5, size=m)))
    assert resumed.update(norms, expected_cohort=m, seed=0, round_=301) == clip.update(
        norms, expected_cohort=m, seed=0, round_=301
    )


def test_adaptive_clip_shrinks_when_all_norms_are_below():
    clip = dp.AdaptiveClip(dp.AdaptiveClipConfig(initial_clip=10.0, count_stddev=0.0))
    new = clip.update({0: 0.1, 1: 0.2}, expected_cohort=2, seed=0, round_=1)
    assert new == pytest.approx(10.0 * math.exp(-0.2 * (1.0 - 0.5)))


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: dp.clip_update({"a": torch.ones(2)}, 0.0), "privacy.clip"),
        (lambda: dp.clip_update({"a": torch.ones(2)}, -1.0), "privacy.clip"),
        (lambda: dp.clip_update({"a": torch.ones(2)}, float("nan")), "privacy.clip"),
        (
            lambda: dp.noisy_mean(
                {"a": torch.ones(2)},
                noise_multiplier=-0.5,
                clip_norm=1.0,
                expected_cohort=2,
                seed=0,
                round_=1,
            ),
            "privacy.noise_multiplier",
        ),
        (
            lambda: dp.add_local_noise(
                {"a": torch.ones(2)},
                noise_multiplier=-1.0,
                clip_norm=1.0,
                seed=0,
                round_=1,
                client=0,
            ),
            "privacy.local_noise_multiplier",
        ),
        (lambda: dp.split_noise_multiplier(1.0, 0.4), "privacy.adaptive_clip.count_stddev"),
        (lambda: dp.split_noise_multiplier(1.0, 0.0), "privacy.adaptive_clip.count_stddev"),
        (lambda: dp.AdaptiveClipConfig(target_quantile=1.5), "adaptive_clip.target_quantile"),
        (lambda: dp.AdaptiveClipConfig(learning_rate=0.0), "adaptive_clip.learning_rate"),
        (lambda: dp.AdaptiveClipConfig(count_stddev=-1.0), "adaptive_clip.count_stddev"),
        (lambda: dp.AdaptiveClipConfig(initial_clip=0.0), "privacy.clip"),
    ],
)
def test_bad_inputs_are_one_line_naming_the_key(call, key):
    with pytest.raises(ConfigError) as err:
        call()
    msg = str(err.value)
    assert key in msg and "\n" not in msg
