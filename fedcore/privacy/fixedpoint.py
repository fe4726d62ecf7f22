"""Fixed-point encoding of float updates into Z_{2^32}, the group secure aggregation sums in.

Why Z_{2^32} and not a prime field (Bonawitz et al. 2017 allow any Z_R): uint32 arithmetic
wraps modulo 2^32 by itself, so a sum of masked vectors is plain NumPy addition; a PRG's bytes
are uniform on Z_{2^32} as they come (a prime field would need rejection sampling); and a
coordinate costs 4 bytes on the wire, as many as the float32 it encodes.

A coordinate x is clipped to [-c, c] and encoded as q = round(x * s) mod 2^32 (two's
complement). The scale s is the largest power of two with n * round(c * s) <= 2^31 - 1, so the
sum of up to n encodings never wraps: read back as a signed 32-bit integer and divided by s
(exact: s is a power of two) it is exactly sum_i round(x_i * s) / s. With the update's L2
norm clipped to C, every coordinate is within [-C, C]: c = C clips nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

MODULUS_BITS = 32
LIMIT = 2 ** (MODULUS_BITS - 1) - 1  # the largest |sum| a signed 32-bit reading holds


@dataclass(frozen=True)
class FixedPoint:
    clip_range: float  # c: coordinates are clipped to [-c, c]
    max_summands: int  # n: a sum of up to n encodings decodes exactly
    scale: float = field(init=False)  # s, a power of two

    def __post_init__(self) -> None:
        c, n = self.clip_range, self.max_summands
        if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
            raise ValueError(f"the fixed-point clip range must be a finite number > 0 (got {c!r})")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"the fixed-point summand count must be an integer >= 1 (got {n!r})")
        k = math.floor(math.log2(LIMIT / (n * c)))
        while n * round(c * 2.0**k) > LIMIT:  # log2's rounding, and round() at the edge
            k -= 1
        if k < -60:
            raise ValueError(f"fixed-point range {c} x {n} summands does not fit in 32 bits")
        object.__setattr__(self, "scale", 2.0**k)

    @property
    def resolution(self) -> float:
        """The spacing of the representable values (1 / s)."""
        return 1 / self.scale

    def encode(self, x: np.ndarray) -> np.ndarray:
        """float array -> uint32 array (round half to even, after clipping)."""
        q = np.rint(
            np.clip(np.asarray(x, dtype=np.float64), -self.clip_range, self.clip_range) * self.scale
        )
        return q.astype(np.int64).astype(np.uint32)  # int64 -> uint32 keeps the low 32 bits

    def decode_sum(self, total: np.ndarray) -> np.ndarray:
        """uint32 sum of up to n encodings -> float64 sum of the encoded values (exact)."""
        return total.astype(np.uint32).view(np.int32).astype(np.float64) / self.scale

    def encode_update(self, update: Mapping[str, torch.Tensor]) -> np.ndarray:
        """The entries, flattened in name order, as one uint32 vector."""
        flat = [
            update[name].detach().cpu().to(torch.float64).numpy().ravel() for name in sorted(update)
        ]
        return self.encode(np.concatenate(flat) if flat else np.zeros(0))

    def decode_update(
        self, total: np.ndarray, like: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """A uint32 sum back into entries shaped, typed and placed like ``like``'s."""
        values = self.decode_sum(total)
        out, at = {}, 0
        for name in sorted(like):
            t = like[name]
            part = values[at : at + t.numel()].reshape(tuple(t.shape))
            out[name] = torch.from_numpy(part.copy()).to(dtype=t.dtype, device=t.device)
            at += t.numel()
        if at != values.size:
            raise ValueError(f"the sum has {values.size} coordinates; the entries hold {at}")
        return out
