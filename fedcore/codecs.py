"""Update codecs: how the tensors that travel are encoded, per direction.

fedapt counts ``len()`` of every payload (``fedcore.payload``); a codec changes what that
payload holds. A codec turns each floating-point tensor into wire tensors (values, indices,
scales, shape headers) that ``payload.encode`` serialises like any state dict, so the bytes
counted are the real encoding's; integer tensors (BatchNorm's step counters) travel as they
are. The receiver decodes before it uses anything: the quantization error is in the model.

* ``cast`` (``fp16``, ``bf16``): each value in a narrower float.
* ``quantize`` (``int8``, ``int4``, 2 bits too): symmetric uniform levels ``q * scale``,
  ``|q| <= 2**(bits-1) - 1``, a scale per tensor or per output channel (dim 0); values below
  8 bits packed into bytes. Rounding to nearest, or stochastic (unbiased: ``floor(x/s + u)``,
  ``u ~ U[0, 1)`` from a generator the engine seeds from (run seed, round, client, slot)).
* ``topk``: the ``k`` largest magnitudes of each tensor (``fraction`` of it, at least one, or
  a fixed ``k``), their flat indices and values; the rest is zero. With error feedback the
  client adds what earlier rounds left out before it selects (its memory, ``EFMemory``).

What a codec encodes: the model's parameters (and the algorithm's extra uploads); its float
buffers, BatchNorm's running statistics, travel as they are, as values (``Codecs.raw``): a
rounded or error-fed running variance can turn negative, and they are two floats a channel.

Which directions a codec serves: client -> server uploads are the client's *update* (trained
minus the state it started from), which any codec encodes; server -> client downloads are
model weights, which casting and quantization (always rounding to nearest: every client of a
round receives the same download) encode and top-k cannot (a sparse model is not a model).

The engines (``fedcore.jobs`` for the process-pool and sequential engines, ``fedcore.cohort``
for the cohort engine) call :func:`encode_update` / :func:`decode_update` on the same inputs
and so agree on every decoded value. Hand-written: no maintained library ships
these wire formats with byte-exact accounting and seeded stochastic rounding.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch

from fedcore.errors import ConfigError

StateDict = dict[str, torch.Tensor]

DIRECTIONS = ("upload", "download")
KINDS = ("none", "cast", "quantize", "topk")
# The codecs a grid can name without defining them (``kind`` and default options).
BUILTIN: dict[str, dict[str, object]] = {
    "none": {"kind": "none"},
    "fp16": {"kind": "cast", "dtype": "float16"},
    "bf16": {"kind": "cast", "dtype": "bfloat16"},
    "int8": {"kind": "quantize", "bits": 8},
    "int4": {"kind": "quantize", "bits": 4},
    "topk": {"kind": "topk"},
}
CAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
BITS = (2, 4, 8)
GRANULARITIES = ("tensor", "channel")
ROUNDINGS = ("stochastic", "nearest")
SEP = "#"  # wire key = model key + SEP + part

CODEC_STREAM = 5  # fedcore.sampling's streams: the stochastic rounding of a client's upload


@dataclass(frozen=True)
class Codec:
    """One codec, with its options; ``encode`` / ``decode`` one tensor."""

    name: str
    kind: str = "none"
    dtype: str = "float16"  # cast
    bits: int = 8  # quantize
    granularity: str = "tensor"  # quantize: a scale per tensor, or per output channel
    rounding: str = "stochastic"  # quantize, uploads (downloads always round to nearest)
    fraction: float | None = 0.01  # topk: the share of each tensor's entries sent
    k: int | None = None  # topk: a fixed count per tensor instead (at most its size)
    error_feedback: bool = True  # topk: the client's memory of what was left out
    directions: tuple[str, ...] = field(default=("upload", "download"))

    @property
    def stochastic(self) -> bool:
        return self.kind == "quantize" and self.rounding == "stochastic"

    @property
    def uses_memory(self) -> bool:
        return self.kind == "topk" and self.error_feedback

    # ---- one tensor ------------------------------------------------------------------
    def encode(
        self, x: torch.Tensor, *, upload: bool = True, gen: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Wire parts of floating tensor ``x`` (part name -> tensor, on ``x``'s device)."""
        if self.kind == "cast":
            return {"": x.to(CAST_DTYPES[self.dtype])}
        if self.kind == "quantize":
            return self._quantize(x, stochastic=upload and self.rounding == "stochastic", gen=gen)
        if self.kind == "topk":
            flat = x.reshape(-1)
            k = self.count(flat.numel())
            idx = _top_indices(flat.abs(), k)
            index_dtype = torch.int32 if flat.numel() < 2**31 else torch.int64
            return {"values": flat[idx], "indices": idx.to(index_dtype), **_shape(x)}
        return {"": x}

    def decode(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The tensor ``encode`` sent, as ``dtype``."""
        if self.kind == "quantize":
            return self._dequantize(parts, dtype)
        if self.kind == "topk":
            shape = [int(s) for s in parts["shape"].tolist()]
            values = parts["values"].to(dtype)
            out = torch.zeros(math.prod(shape), dtype=dtype, device=values.device)
            out[parts["indices"].long()] = values
            return out.reshape(shape)
        return parts[""].to(dtype)

    def count(self, numel: int) -> int:
        """topk: the entries sent of a tensor of ``numel`` (a fraction rounds up)."""
        if self.k is not None:
            if self.k > numel:
                raise ConfigError(
                    f"codec {self.name}: k {self.k} is above the size of a tensor it encodes "
                    f"({numel} entries); use a k of at most {numel}, or fraction"
                )
            return self.k
        assert self.fraction is not None
        return max(1, min(numel, math.ceil(self.fraction * numel)))

    def _quantize(
        self, x: torch.Tensor, *, stochastic: bool, gen: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
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

    def _dequantize(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        scale = parts["scale"].to(dtype)
        if self.bits == 8:
            q = parts["q"]
        else:
            shape = [int(s) for s in parts["shape"].tolist()]
            q = _unpack(parts["q"], self.bits, math.prod(shape)).reshape(shape)
        if scale.dim() == 1:  # per channel
            scale = scale.reshape(-1, *([1] * (q.dim() - 1)))
        return q.to(dtype) * scale


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


# ---- building codecs from options ---------------------------------------------------------
def make_codec(name: str, options: Mapping[str, object] | None = None) -> Codec:
    """The codec ``name`` (a built-in name, or one defined in ``options`` with a ``kind``),
    its options checked: one :class:`ConfigError` line naming the key and allowed values."""
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
    merged = {**base, **opts}
    allowed = {
        "none": {"directions"},
        "cast": {"dtype", "directions"},
        "quantize": {"bits", "granularity", "rounding", "directions"},
        "topk": {"fraction", "k", "error_feedback", "directions"},
    }[kind]
    unknown = sorted(set(merged) - allowed)
    if unknown:
        raise ConfigError(
            f"grid.codec_options.{name}: unknown option {unknown[0]!r} for kind {kind}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    key = f"grid.codec_options.{name}"
    default_dirs = ("upload",) if kind == "topk" else DIRECTIONS
    dirs = merged.get("directions", default_dirs)
    if isinstance(dirs, str) or not isinstance(dirs, list | tuple) or not dirs:
        raise ConfigError(f"{key}.directions: a list of {', '.join(DIRECTIONS)} (got {dirs!r})")
    for d in dirs:
        if d not in DIRECTIONS:
            raise ConfigError(f"{key}.directions: {d!r} is not one of {', '.join(DIRECTIONS)}")
    if kind == "topk" and "download" in dirs:
        raise ConfigError(
            f"{key}.directions: topk cannot serve download (a sparse model is not a model); "
            "allowed: [upload]"
        )
    fields: dict[str, object] = {
        "name": name,
        "kind": kind,
        "directions": tuple(dict.fromkeys(dirs)),
    }
    if kind == "cast":
        dtype = merged.get("dtype", "float16")
        if dtype not in CAST_DTYPES:
            raise ConfigError(f"{key}.dtype: {dtype!r} is not one of {', '.join(CAST_DTYPES)}")
        fields["dtype"] = dtype
    elif kind == "quantize":
        bits = merged.get("bits", 8)
        if isinstance(bits, bool) or bits not in BITS:
            raise ConfigError(
                f"{key}.bits: {bits!r} is not supported; allowed: {', '.join(map(str, BITS))}"
            )
        gran = merged.get("granularity", "tensor")
        if gran not in GRANULARITIES:
            raise ConfigError(
                f"{key}.granularity: {gran!r} is not one of {', '.join(GRANULARITIES)}"
            )
        rounding = merged.get("rounding", "stochastic")
        if rounding not in ROUNDINGS:
            raise ConfigError(f"{key}.rounding: {rounding!r} is not one of {', '.join(ROUNDINGS)}")
        fields.update(bits=int(bits), granularity=gran, rounding=rounding)  # type: ignore[call-overload]
    elif kind == "topk":
        k = merged.get("k")
        fraction = merged.get("fraction", None if k is not None else 0.01)
        if k is not None and fraction is not None:
            raise ConfigError(f"{key}: give fraction or k, not both")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k <= 0):
            raise ConfigError(f"{key}.k: {k!r} must be a whole number of entries above 0")
        if fraction is not None and (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 < fraction <= 1
        ):
            raise ConfigError(f"{key}.fraction: {fraction!r} must be in (0, 1]")
        ef = merged.get("error_feedback", True)
        if not isinstance(ef, bool):
            raise ConfigError(f"{key}.error_feedback: {ef!r} must be true or false")
        fields.update(  # type: ignore[call-overload]
            k=k, fraction=None if fraction is None else float(fraction), error_feedback=ef
        )
    return Codec(**fields)  # type: ignore[arg-type]


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
    if codec is None or codec.kind != "topk" or codec.k is None:
        return
    for t in state.values():
        if t.is_floating_point():
            codec.count(t.numel())


# ---- what travels: a state dict through a codec --------------------------------------------
def encode_state(
    codec: Codec,
    state: Mapping[str, torch.Tensor],
    *,
    upload: bool,
    gen: torch.Generator | None,
    raw: Collection[str] = (),
) -> StateDict:
    """The wire state dict of ``state``: each floating tensor's parts under
    ``key + SEP + part`` (a cast under ``key`` itself), other tensors and ``raw`` keys as
    they are."""
    wire: StateDict = {}
    for k, v in state.items():
        if not v.is_floating_point() or k in raw:
            wire[k] = v
            continue
        for part, t in codec.encode(v.detach(), upload=upload, gen=gen).items():
            wire[k + SEP + part if part else k] = t
    return wire


def decode_state(
    codec: Codec,
    wire: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    raw: Collection[str] = (),
) -> StateDict:
    """Inverse of :func:`encode_state`; encoded tensors come back as ``dtype``."""
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for wk, t in wire.items():
        key, _, part = wk.partition(SEP)
        grouped.setdefault(key, {})[part] = t
    out: StateDict = {}
    for key, parts in grouped.items():
        if set(parts) == {""} and (key in raw or not parts[""].is_floating_point()):
            out[key] = parts[""]  # sent as it is
        else:
            out[key] = codec.decode(parts, dtype)
    return out


def float_dtype(state: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype of a model's state (the first floating tensor's)."""
    return next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)


def codec_generator(seed: int) -> torch.Generator:
    """A client upload's rounding generator, from the client job's seed (itself derived from
    (run seed, round, client, slot)): the same in every engine, on every device (CPU)."""
    from fedcore.sampling import derive_seed

    return torch.Generator().manual_seed(derive_seed(seed, CODEC_STREAM) % 2**63)


@dataclass
class EncodedUpdate:
    """A client's upload through its codec: the wire (what is counted), the update the server
    decodes from it, and the client's next error-feedback memory (None: the codec keeps none)."""

    wire: StateDict
    decoded: StateDict
    memory: StateDict | None


def encode_update(
    codec: Codec,
    start: Mapping[str, torch.Tensor],
    trained: Mapping[str, torch.Tensor],
    extra: Mapping[str, torch.Tensor],
    *,
    seed: int,
    memory: Mapping[str, torch.Tensor] | None,
    raw: Collection[str] = (),
) -> EncodedUpdate:
    """The client's side: its update (``trained - start`` per floating model key; the
    algorithm's ``extra`` uploads, already differences, as they are; ``raw`` keys, values
    sent as they are), plus its error-feedback memory, encoded. ``decoded`` is exactly what
    the server decodes from ``wire``."""
    update: StateDict = {}
    for k, v in trained.items():
        coded = v.is_floating_point() and k not in raw
        update[k] = v.detach() - start[k] if coded else v.detach()
    update.update(extra)
    if codec.uses_memory and memory:
        update = {k: v + memory[k].to(v.device) if k in memory else v for k, v in update.items()}
    gen = codec_generator(seed) if codec.stochastic else None
    wire = encode_state(codec, update, upload=True, gen=gen, raw=raw)
    decoded = decode_state(codec, wire, float_dtype(update), raw)
    new_memory = None
    if codec.uses_memory:
        new_memory = {
            k: (v - decoded[k]).to("cpu")
            for k, v in update.items()
            if v.is_floating_point() and k not in raw
        }
    return EncodedUpdate(wire, decoded, new_memory)


def decode_update(
    codec: Codec,
    wire: Mapping[str, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    prefix: str,
    raw: Collection[str] = (),
) -> StateDict:
    """The server's side: ``wire`` decoded and applied to the server's own model (the update
    of a model key added to its global value; keys starting with ``prefix``, the algorithm's
    extra uploads, and ``raw`` keys kept as decoded): what the algorithm aggregates."""
    decoded = decode_state(codec, wire, float_dtype(global_state), raw)
    return apply_update(decoded, global_state, prefix, raw)


def apply_update(
    decoded: Mapping[str, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    prefix: str,
    raw: Collection[str] = (),
) -> StateDict:
    """The decoded update on the server's model: ``global + update`` per floating model key
    (``raw`` keys and the ``prefix``-ed extras are values, kept as they are)."""
    out: StateDict = {}
    for k, v in decoded.items():
        if k.startswith(prefix) or k in raw or not v.is_floating_point():
            out[k] = v
        else:
            g = global_state[k]
            out[k] = g + v.to(g.device)
    return out


def download_state(
    codec: Codec, state: Mapping[str, torch.Tensor], raw: Collection[str] = ()
) -> tuple[StateDict, StateDict]:
    """(wire, decoded) of a download through ``codec``: model weights rounded to nearest,
    the same for every client of a round (``raw`` keys as they are)."""
    wire = encode_state(codec, state, upload=False, gen=None, raw=raw)
    return wire, decode_state(codec, wire, float_dtype(state), raw)
