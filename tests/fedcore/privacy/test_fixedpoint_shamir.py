"""SecAgg's building blocks: the Z_{2^32} fixed-point encoding and Shamir secret sharing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedcore.privacy import shamir
from fedcore.privacy.fixedpoint import LIMIT, FixedPoint


@pytest.mark.parametrize("clip, n", [(1.0, 1), (1.0, 10), (0.37, 100), (50.0, 7), (1e-3, 1000)])
def test_fixed_point_sum_decodes_exactly(clip, n):
    fp = FixedPoint(clip, n)
    assert fp.scale == 2.0 ** round(np.log2(fp.scale))  # a power of two
    assert n * round(clip * fp.scale) <= LIMIT < n * round(clip * fp.scale * 2)  # the largest
    rng = np.random.default_rng(n)
    xs = [rng.uniform(-1.5 * clip, 1.5 * clip, size=257) for _ in range(n)]
    xs[0][:3] = [clip, -clip, 10 * clip]  # the extremes, and one beyond the range
    if n > 1:  # every summand at the edge: the largest sum must not wrap
        xs[1][:] = clip
    total = np.zeros(257, dtype=np.uint32)
    for x in xs:
        total += fp.encode(x)
    want = sum(np.rint(np.clip(x, -clip, clip) * fp.scale) for x in xs) / fp.scale
    assert np.array_equal(fp.decode_sum(total), want)  # exact, not approximately
    worst = n * clip  # ... and within n/2 steps of the float sum of the clipped values
    assert np.abs(fp.decode_sum(total) - sum(np.clip(x, -clip, clip) for x in xs)).max() <= (
        n * fp.resolution / 2 + 1e-12 * worst
    )


def test_fixed_point_update_round_trip():
    update = {
        "b": torch.tensor([0.25, -0.5], dtype=torch.float64),
        "a": torch.tensor([[0.125]], dtype=torch.float32),
    }
    fp = FixedPoint(1.0, 3)
    encoded = fp.encode_update(update)
    assert encoded.dtype == np.uint32 and encoded.size == 3
    back = fp.decode_update(encoded, update)
    assert back["a"].dtype == torch.float32 and back["b"].dtype == torch.float64
    assert torch.equal(back["a"], update["a"]) and torch.equal(back["b"], update["b"])
    with pytest.raises(ValueError, match="coordinates"):
        fp.decode_update(np.zeros(5, dtype=np.uint32), update)


@pytest.mark.parametrize("bad", [(0.0, 3), (-1.0, 3), (float("inf"), 3), (1.0, 0)])
def test_fixed_point_refuses_bad_ranges(bad):
    with pytest.raises(ValueError):
        FixedPoint(*bad)


@pytest.mark.parametrize("n, t", [(1, 1), (5, 3), (7, 7), (10, 6)])
def test_shamir_any_t_shares_reconstruct(n, t):
    secret = int.from_bytes(bytes(range(32)), "little")
    shares = shamir.split(secret, n, t, seed=b"s")
    assert shares == shamir.split(secret, n, t, seed=b"s")  # seeded: reproducible
    for subset in itertools.islice(itertools.combinations(shares, t), 20):
        assert shamir.reconstruct(list(subset)) == secret
    if t > 1:  # fewer than t shares give something else
        assert shamir.reconstruct(shares[: t - 1]) != secret
    wire = [shamir.share_to_bytes(s) for s in shares]
    assert all(len(w) == shamir.SHARE_BYTES == 70 for w in wire)
    assert [shamir.share_from_bytes(w) for w in wire] == shares


def test_shamir_refuses_bad_arguments():
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(1, 3, 4, b"")
    with pytest.raises(ValueError, match="secret"):
        shamir.split(shamir.PRIME, 3, 2, b"")
    with pytest.raises(ValueError, match="distinct"):
        shamir.reconstruct([(1, 2), (1, 3)])
