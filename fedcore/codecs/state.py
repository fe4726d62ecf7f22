"""What travels: a state dict through a codec, per direction (the engines' side: client
updates encoded and decoded, downloads, error-feedback memory, the seeded rounding)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from fedcore.codecs.base import SEP, Codec, StateDict

CODEC_STREAM = 5  # fedcore.sampling's streams: the stochastic rounding of a client's upload


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
