"""Shamir's t-of-n secret sharing over the prime field GF(2^521 - 1), for SecAgg's seeds and
private keys (32-byte secrets, so any prime above 2^256 holds them; 2^521 - 1 is a Mersenne
prime, known prime without a test).

A secret a_0 is the constant term of a random polynomial f of degree t - 1; party x (1..n)
gets f(x); any t shares give a_0 back by Lagrange interpolation at 0, fewer say nothing
(Shamir 1979). The coefficients are drawn from SHAKE-256 of a caller-given seed, so a
simulation is reproducible.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

PRIME = 2**521 - 1
VALUE_BYTES = (PRIME.bit_length() + 7) // 8  # 66
SHARE_BYTES = 4 + VALUE_BYTES  # x as uint32, then f(x)


def split(secret: int, n: int, t: int, seed: bytes) -> list[tuple[int, int]]:
    """n shares (x, f(x)) for x = 1..n of ``secret``, any t of which reconstruct it."""
    if not 0 <= secret < PRIME:
        raise ValueError("a Shamir secret must lie in [0, 2^521 - 1)")
    if not 1 <= t <= n:
        raise ValueError(f"a Shamir threshold must be in [1, n={n}] (got {t})")
    stream = hashlib.shake_256(b"fedapt/shamir/" + seed).digest((VALUE_BYTES + 8) * (t - 1))
    step = VALUE_BYTES + 8  # 8 spare bytes make the reduction mod PRIME all but uniform
    coefficients = [secret] + [
        int.from_bytes(stream[i * step : (i + 1) * step], "little") % PRIME for i in range(t - 1)
    ]
    return [(x, _evaluate(coefficients, x)) for x in range(1, n + 1)]


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    y = 0
    for a in reversed(coefficients):  # Horner
        y = (y * x + a) % PRIME
    return y


def reconstruct(shares: Sequence[tuple[int, int]]) -> int:
    """f(0) from shares at distinct x (Lagrange at 0); with fewer than t shares the result is
    a field element unrelated to the secret."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs) or not shares:
        raise ValueError("Shamir reconstruction needs shares at distinct, non-empty x")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * -xj % PRIME
                den = den * (xi - xj) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    return secret


def share_to_bytes(share: tuple[int, int]) -> bytes:
    x, y = share
    return struct.pack("<I", x) + y.to_bytes(VALUE_BYTES, "little")


def share_from_bytes(data: bytes) -> tuple[int, int]:
    if len(data) != SHARE_BYTES:
        raise ValueError(f"a serialised share has {SHARE_BYTES} bytes (got {len(data)})")
    return struct.unpack("<I", data[:4])[0], int.from_bytes(data[4:], "little")
