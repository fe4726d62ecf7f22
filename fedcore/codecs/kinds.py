"""The codec kinds, in one table (``KINDS``): each a frozen dataclass of its options (typed
through ``fedcore.options``, as an algorithm's are), a subclass of ``base.Codec`` that
encodes and decodes one tensor; the
codecs a grid can name without defining them (``BUILTIN``); :func:`make_codec`, the one place
a codec's options are checked; and a run's pair of codecs (``Codecs``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from annotated_types import Gt, Le, MinLen
from pydantic import Strict

from fedcore.codecs.base import DIRECTIONS, Codec, Direction
from fedcore.errors import ConfigError
from fedcore.options import Float, Int, option_names, parse

CAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Cast(Codec):
    """Each value in a narrower float (``fp16``, ``bf16``)."""

    kind: ClassVar[str] = "cast"
    dtype: Literal["float16", "bfloat16"] = "float16"

    def encode(
        self, x: torch.Tensor, *, upload: bool = True, gen: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        return {"": x.to(CAST_DTYPES[self.dtype])}


@dataclass(frozen=True)
class Quantize(Codec):
    """Symmetric uniform levels ``q * scale``, ``|q| <= 2**(bits-1) - 1``, a scale per tensor
    or per output channel (dim 0); below 8 bits packed into bytes. Uploads round at random
    (``floor(x/s + u)``, unbiased) or to nearest; downloads always to nearest."""

    kind: ClassVar[str] = "quantize"
    bits: Literal[2, 4, 8] = 8
    granularity: Literal["tensor", "channel"] = "tensor"
    rounding: Literal["stochastic", "nearest"] = "stochastic"

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    def encode(
        self, x: torch.Tensor, *, upload: bool = True, gen: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        stochastic = upload and self.rounding == "stochastic"
        levels = 2 ** (self.bits - 1) - 1
        per_channel = self.granularity == "channel" and x.dim() >= 2
        mag = x.abs().reshape(x.shape[0], -1).amax(dim=1) if per_channel else x.abs().amax()
        scale = (mag / levels).to(torch.float32)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(x.dtype)
        y = x / (safe.reshape(-1, *([1] * (x.dim() - 1))) if per_channel else safe)
        if stochastic:
            if gen is None:
                raise ValueError("stochastic rounding needs the client's generator")
            u = torch.rand(x.shape, generator=gen, dtype=x.dtype, device="cpu").to(x.device)
            q = torch.floor(y + u)
        else:
            q = torch.round(y)
        q = q.clamp(-levels, levels).to(torch.int8)
        if self.bits == 8:
            return {"q": q, "scale": scale}
        return {"q": _pack(q, self.bits), "scale": scale, **_shape(x)}

    def decode(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        scale = parts["scale"].to(dtype)
        if self.bits == 8:
            q = parts["q"]
        else:
            shape = [int(s) for s in parts["shape"].tolist()]
            q = _unpack(parts["q"], self.bits, math.prod(shape)).reshape(shape)
        if scale.dim() == 1:  # per channel
            scale = scale.reshape(-1, *([1] * (q.dim() - 1)))
        return q.to(dtype) * scale


@dataclass(frozen=True)
class TopK(Codec):
    """The ``k`` largest magnitudes of each tensor (``fraction`` of it, at least one, or a
    fixed ``k``), their flat indices and values; the rest is zero. Uploads only (a sparse
    model is not a model). With error feedback the client adds what earlier rounds left out
    before it selects (its memory)."""

    kind: ClassVar[str] = "topk"
    directions: Annotated[tuple[Direction, ...], MinLen(1)] = ("upload",)
    fraction: Annotated[Float, Gt(0), Le(1)] | None = 0.01  # the share of each tensor sent
    k: Annotated[Int, Gt(0)] | None = None  # a fixed count per tensor instead
    error_feedback: Annotated[bool, Strict()] = True

    @property
    def uses_memory(self) -> bool:
        return self.error_feedback

    def encode(
        self, x: torch.Tensor, *, upload: bool = True, gen: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        flat = x.reshape(-1)
        idx = _top_indices(flat.abs(), self.count(flat.numel()))
        index_dtype = torch.int32 if flat.numel() < 2**31 else torch.int64
        return {"values": flat[idx], "indices": idx.to(index_dtype), **_shape(x)}

    def decode(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        shape = [int(s) for s in parts["shape"].tolist()]
        values = parts["values"].to(dtype)
        out = torch.zeros(math.prod(shape), dtype=dtype, device=values.device)
        out[parts["indices"].long()] = values
        return out.reshape(shape)

    def count(self, numel: int) -> int:
        """The entries sent of a tensor of ``numel`` (a fraction rounds up)."""
        if self.k is not None:
            if self.k > numel:
                raise ConfigError(
                    f"codec {self.name}: k {self.k} is above the size of a tensor it encodes "
                    f"({numel} entries); use a k of at most {numel}, or fraction"
                )
            return self.k
        assert self.fraction is not None
        return max(1, min(numel, math.ceil(self.fraction * numel)))


# The codec kinds, in one table. Adding one: its dataclass (a ``base.Codec`` subclass, in a
# module of its own) and its line here (docs/extending.md).
KINDS: dict[str, type[Codec]] = {"none": Codec, "cast": Cast, "quantize": Quantize, "topk": TopK}
# The codecs a grid can name without defining them (``kind`` and default options).
BUILTIN: dict[str, dict[str, object]] = {
    "none": {"kind": "none"},
    "fp16": {"kind": "cast", "dtype": "float16"},
    "bf16": {"kind": "cast", "dtype": "bfloat16"},
    "int8": {"kind": "quantize", "bits": 8},
    "int4": {"kind": "quantize", "bits": 4},
    "topk": {"kind": "topk"},
}


def make_codec(name: str, options: Mapping[str, object] | None = None) -> Codec:
    """The codec ``name`` (a built-in name, or one defined in ``options`` with a ``kind``),
    its options typed by its kind's dataclass: one :class:`ConfigError` line naming the key
    and the allowed values."""
    opts = dict(options or {})
    base = dict(BUILTIN.get(name, {}))
    kind = str(opts.pop("kind", base.pop("kind", "")))
    if not kind:
        raise ConfigError(
            f"codec {name!r}: unknown; built-in codecs: {', '.join(BUILTIN)} "
            f"(or define it under grid.codec_options with kind: {' | '.join(KINDS)})"
        )
    if kind not in KINDS:
        raise ConfigError(
            f"grid.codec_options.{name}.kind: {kind!r} is not one of {', '.join(KINDS)}"
        )
    cls, key = KINDS[kind], f"grid.codec_options.{name}"
    given: dict[str, Any] = {**base, **opts}
    allowed = [o for o in option_names(cls) if o != "name"]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{key}: unknown option {unknown[0]!r} for kind {kind}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    if cls is TopK and given.get("k") is not None:
        if given.get("fraction") is not None:
            raise ConfigError(f"{key}: give fraction or k, not both")
        given["fraction"] = None  # a fixed k instead of the default fraction
    if "directions" in given:  # a non-empty list, each direction once
        dirs = given["directions"]
        if isinstance(dirs, str) or not isinstance(dirs, list | tuple) or not dirs:
            raise ConfigError(f"{key}.directions: a list of {', '.join(DIRECTIONS)} (got {dirs!r})")
        given["directions"] = tuple(dict.fromkeys(dirs))
    codec = parse(cls, {**given, "name": name}, key)
    if "download" in codec.directions and cls is TopK:
        raise ConfigError(
            f"{key}.directions: topk cannot serve download (a sparse model is not a model); "
            "allowed: [upload]"
        )
    return codec


@dataclass(frozen=True)
class Codecs:
    """A run's codecs: ``upload`` (client -> server) and ``download`` (server -> client);
    None: float32 as the model holds it, the engine's default path."""

    name: str = "none"
    upload: Codec | None = None
    download: Codec | None = None
    raw: frozenset[str] = frozenset()  # keys sent as they are: the model's float buffers

    @classmethod
    def of(cls, codec: Codec) -> Codecs:
        """``codec`` on the directions it is configured for (``none``: neither)."""
        if codec.kind == "none":
            return cls(codec.name)
        return cls(
            codec.name,
            codec if "upload" in codec.directions else None,
            codec if "download" in codec.directions else None,
        )

    @property
    def active(self) -> bool:
        return self.upload is not None or self.download is not None


def check_sizes(codec: Codec | None, state: Mapping[str, torch.Tensor]) -> None:
    """A fixed top-k ``k`` above the size of a tensor it would encode -> one line."""
    if not isinstance(codec, TopK) or codec.k is None:
        return
    for t in state.values():
        if t.is_floating_point():
            codec.count(t.numel())


# ---- the wire formats -------------------------------------------------------------------------
def _top_indices(mag: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest of ``mag``, ties to the lower index, in index order:
    the same selection on every device and whatever order ``torch.topk`` returns ties in
    (everything above the k-th largest value, then the first of those equal to it)."""
    kth = torch.topk(mag, k, sorted=False).values.min()
    above = (mag > kth).nonzero().squeeze(1)
    at = (mag == kth).nonzero().squeeze(1)[: k - above.numel()]
    idx = torch.cat([above, at])
    if idx.numel() != k:  # NaN magnitudes compare false: a stable sort decides
        idx = torch.sort(mag, descending=True, stable=True).indices[:k]
    return torch.sort(idx).values


def _shape(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The shape header a packed or sparse tensor needs to be rebuilt."""
    return {"shape": torch.tensor(list(x.shape), dtype=torch.int32, device=x.device)}


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """``bits``-bit signed levels, ``8 // bits`` to a byte (offset to unsigned), low first."""
    per = 8 // bits
    u = (q.reshape(-1).to(torch.int16) + 2 ** (bits - 1)).to(torch.uint8)
    pad = (-u.numel()) % per
    if pad:
        u = torch.cat([u, u.new_zeros(pad)])
    u = u.reshape(-1, per)
    out = torch.zeros(u.shape[0], dtype=torch.uint8, device=q.device)
    for i in range(per):
        out |= u[:, i] << (bits * i)
    return out


def _unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    per = 8 // bits
    mask = (1 << bits) - 1
    cols = [((packed >> (bits * i)) & mask) for i in range(per)]
    u = torch.stack(cols, dim=1).reshape(-1)[:numel]
    return u.to(torch.int16).sub(2 ** (bits - 1)).to(torch.int8)
