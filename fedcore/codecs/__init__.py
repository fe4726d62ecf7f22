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
and so agree on every decoded value. By job: ``base`` (the ``Codec`` every kind subclasses), ``kinds`` (the table of codec kinds, their
options and one tensor's wire format, ``make_codec``) and ``state`` (a state dict through a
codec, per direction). Hand-written: no maintained library ships
these wire formats with byte-exact accounting and seeded stochastic rounding.
"""

from fedcore.codecs.base import DIRECTIONS, SEP, Codec, StateDict
from fedcore.codecs.kinds import (
    BUILTIN,
    CAST_DTYPES,
    KINDS,
    Cast,
    Codecs,
    Quantize,
    TopK,
    check_sizes,
    make_codec,
)
from fedcore.codecs.state import (
    CODEC_STREAM,
    EncodedUpdate,
    apply_update,
    codec_generator,
    decode_state,
    decode_update,
    download_state,
    encode_state,
    encode_update,
    float_dtype,
)

__all__ = [
    "BUILTIN",
    "CAST_DTYPES",
    "CODEC_STREAM",
    "DIRECTIONS",
    "KINDS",
    "SEP",
    "Cast",
    "Codec",
    "Codecs",
    "EncodedUpdate",
    "Quantize",
    "StateDict",
    "TopK",
    "apply_update",
    "check_sizes",
    "codec_generator",
    "decode_state",
    "decode_update",
    "download_state",
    "encode_state",
    "encode_update",
    "float_dtype",
    "make_codec",
]
