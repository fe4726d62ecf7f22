"""fedcore.privacy.secagg: the server's sum is exact (with dropouts), it never holds an
unmasked update, and the byte counts are the serialised lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedcore.errors import ConfigError
from fedcore.privacy import secagg, shamir
from fedcore.privacy.fixedpoint import FixedPoint


def quantized_updates(n: int, d: int, seed: int = 0) -> dict[int, np.ndarray]:
    """Small, very non-uniform values (as real quantized updates are)."""
    rng = np.random.default_rng(seed)
    fp = FixedPoint(1.0, n)
    return {10 + 3 * c: fp.encode(rng.normal(0, 0.01, size=d)) for c in range(n)}


def plain_sum(inputs: dict[int, np.ndarray], ids) -> np.ndarray:
    total = np.zeros(next(iter(inputs.values())).size, dtype=np.uint32)
    for c in ids:
        total += inputs[c]
    return total


CASES = [  # (n, t, dropped after keys, after sharing, after masking)
    (5, 3, [], [], []),
    (10, 6, [], [13, 22, 37], []),  # 30% drop after sharing
    (10, 6, [], [10, 19, 31], [16]),  # ... and one more after sending its masked vector
    (10, 7, [25], [13, 22], []),  # one never shares
    (2, 2, [], [], []),
]


@pytest.mark.parametrize("n, t, after_keys, after_sharing, after_masking", CASES)
def test_server_sum_is_the_plain_quantized_sum(n, t, after_keys, after_sharing, after_masking):
    inputs = quantized_updates(n, 300)
    done = secagg.secure_sum(
        inputs,
        threshold=t,
        seed=5,
        round_=3,
        dropped_after_keys=after_keys,
        dropped_after_sharing=after_sharing,
        dropped_after_masking=after_masking,
    )
    gone = set(after_keys) | set(after_sharing)
    assert done.survivors == tuple(c for c in sorted(inputs) if c not in gone)
    assert np.array_equal(done.total, plain_sum(inputs, done.survivors))  # bit for bit
    again = secagg.secure_sum(
        inputs,
        threshold=t,
        seed=5,
        round_=3,
        dropped_after_keys=after_keys,
        dropped_after_sharing=after_sharing,
        dropped_after_masking=after_masking,
    )
    assert again.server.received == done.server.received  # seeded: the same bytes


def test_server_never_holds_an_unmasked_update():
    n, d = 10, 4096
    inputs = quantized_updates(n, d)
    inputs[13] = np.zeros(d, dtype=np.uint32)  # the easiest update to spot
    dropped = [13, 22, 37]
    done = secagg.secure_sum(inputs, threshold=6, seed=1, round_=1, dropped_after_sharing=dropped)
    server = done.server
    assert {kind for kind, _ in server.received} == {"keys", "shares", "masked", "unmask"}
    everything = b"".join(msg for _, msg in server.received)
    masked = [msg for kind, msg in server.received if kind == "masked"]
    assert len(masked) == n - len(dropped)
    for x in inputs.values():
        assert x[:64].tobytes() not in everything  # no update, not even a prefix of one
    partial = {c: plain_sum(inputs, [c]) for c in inputs}
    for msg in masked:
        y = np.frombuffer(msg, dtype="<u4", offset=4)
        assert not any(np.array_equal(y, x) for x in partial.values())
        # uniform on Z_{2^32}: the top 4 bits fall evenly in 16 bins (the inputs' do not)
        counts = np.bincount(y >> 28, minlength=16)
        assert stats.chisquare(counts).pvalue > 1e-4
    x_counts = np.bincount(inputs[10] >> 28, minlength=16)
    assert stats.chisquare(x_counts).pvalue < 1e-10
    # the unmasking gives the server one kind of share per client, never both
    step = 4 + 1 + shamir.SHARE_BYTES
    kinds: dict[int, set[int]] = {}
    for kind, msg in server.received:
        if kind == "unmask":
            for at in range(0, len(msg), step):
                kinds.setdefault(int.from_bytes(msg[at : at + 4], "little"), set()).add(msg[at + 4])
    assert all(len(k) == 1 for k in kinds.values())
    assert {c for c, k in kinds.items() if k == {secagg.SECRET_KEY}} == set(dropped)


def test_byte_counts_are_the_serialised_lengths():
    n, d, t = 10, 500, 6
    dropped = [13, 22, 37]
    done = secagg.secure_sum(
        quantized_updates(n, d), threshold=t, seed=2, round_=7, dropped_after_sharing=dropped
    )
    received: dict[str, int] = {}
    for kind, msg in done.server.received:
        received[kind] = received.get(kind, 0) + len(msg)
    assert done.upload == {**dict.fromkeys(secagg.STAGES, 0), **received}
    survivors = n - len(dropped)
    # by hand: 68-byte adverts; 164-byte ciphertexts (+ 4-byte address) to the n - 1 others;
    # id + 4 bytes per coordinate; one 75-byte share (owner, kind, x, f(x)) per U2 client from
    # each survivor
    assert done.upload["keys"] == n * 68
    assert done.upload["shares"] == n * (n - 1) * (4 + 164)
    assert done.upload["masked"] == survivors * (4 + 4 * d)
    assert done.upload["unmask"] == survivors * n * (4 + 1 + 4 + 66)
    # downloads: the key list to each of the n, the n - 1 ciphertexts to each survivor, U3
    assert done.download["keys"] == n * n * 68
    assert done.download["shares"] == survivors * (n - 1) * (4 + 164)
    assert done.download["unmask"] == survivors * survivors * 4
    assert done.download["masked"] == 0
    broadcast = [msg for kind, msg in done.server.sent if kind == "keys"]
    assert len(broadcast) == 1 and len(broadcast[0]) == n * 68  # sent once, delivered n times


def test_secure_sum_of_float_updates():
    g = torch.Generator().manual_seed(0)
    updates = {c: {"w": torch.randn(4, 3, generator=g) * 0.1, "b": torch.randn(3, generator=g) * 0.1}
               for c in range(6)}  # fmt: skip
    total, done = secagg.secure_sum_updates(
        updates, clip_range=1.0, threshold=4, seed=0, round_=1, dropped_after_sharing=[2]
    )
    fp = FixedPoint(1.0, 6)
    want = {k: sum(fp.decode_update(fp.encode_update(updates[c]), updates[c])[k]
                   for c in done.survivors) for k in ("w", "b")}  # fmt: skip
    assert torch.allclose(total["w"], want["w"], atol=1e-6)
    assert torch.allclose(total["b"], sum(updates[c]["b"] for c in done.survivors), atol=1e-6)
    assert total["w"].dtype == torch.float32


def test_too_many_dropouts_abort_in_one_line():
    with pytest.raises(secagg.SecAggAborted) as err:
        secagg.secure_sum(
            quantized_updates(5, 10),
            threshold=3,
            seed=0,
            round_=4,
            dropped_after_masking=[10, 13, 16],
        )
    assert "privacy.secagg_threshold" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "n, t", [(5, 6), (5, 2), (10, 5), (10, 0), (2, 1), (1, 1), (5, 3.0), (5, True)]
)
def test_bad_threshold_is_one_line_naming_the_key(n, t):
    with pytest.raises(ConfigError) as err:
        secagg.secure_sum(quantized_updates(n, 8), threshold=t, seed=0, round_=1)
    assert "privacy.secagg_threshold" in str(err.value) and "\n" not in str(err.value)
