"""Update codecs (``fedcore.codecs``): the wire formats, the bytes they cost, both engines.

Each codec's encoding is checked on its own (levels, scales, packing, the top-k selection,
seeded stochastic rounding), then in federations on the float64 tiny models of
``tests/fedcore/cohort/test_cohort.py``: the cohort engine against the sequential reference for every codec
(to 1e-9, as without a codec), the reported bytes against real encodings every round, the
error-feedback memory (what it holds, dropout, resume) and the one-line refusals.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedcore import jobs, payload
from fedcore.algorithms.base import UPLOAD
from fedcore.codecs import (
    Codecs,
    apply_update,
    decode_state,
    encode_state,
    encode_update,
    make_codec,
)
from fedcore.errors import ConfigError
from tests.fedcore.cohort.support import TOL, assert_same, simulate


def codecs(name: str, **options) -> Codecs:
    return Codecs.of(make_codec(name, options))


def roundtrip(codec, x, *, upload=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    wire = encode_state(codec, {"w": x}, upload=upload, gen=gen)
    return wire, decode_state(codec, wire, x.dtype)["w"]


# ---- one tensor ---------------------------------------------------------------------------
def test_casts_send_the_narrow_float_and_decode_to_the_model_dtype():
    x = torch.randn(5, 7, dtype=torch.float64)
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        wire, back = roundtrip(make_codec(name), x)
        assert wire["w"].dtype == dtype and back.dtype == torch.float64
        assert torch.equal(back, x.to(dtype).double())


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_quantization_levels_scales_and_packing(bits, granularity):
    x = torch.randn(6, 3, 5, generator=torch.Generator().manual_seed(bits))
    codec = make_codec("q", {"kind": "quantize", "bits": bits, "granularity": granularity,
                             "rounding": "nearest"})  # fmt: skip
    wire, back = roundtrip(codec, x)
    levels = 2 ** (bits - 1) - 1
    per = 8 // bits
    assert wire["w#q"].dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert wire["w#q"].numel() == math.ceil(x.numel() / per)
    scale = wire["w#scale"]
    assert scale.dtype == torch.float32
    if granularity == "channel":
        expect = x.abs().reshape(6, -1).amax(1) / levels
        assert scale.shape == (6,)
        err = (back - x).abs().reshape(6, -1).amax(1)
        assert bool((err <= expect / 2 + 1e-6).all())
    else:
        expect = x.abs().amax() / levels
        assert scale.shape == ()
        assert float((back - x).abs().max()) <= float(expect) / 2 + 1e-6
    torch.testing.assert_close(scale, expect.float())
    # every decoded value is an integer number of its scale, within the levels
    s = scale.reshape(-1, 1, 1) if granularity == "channel" else scale
    q = back / s
    assert torch.allclose(q, q.round(), atol=1e-4) and float(q.abs().max()) <= levels + 1e-4
    if bits < 8:  # the shape header rebuilds the packed tensor
        assert wire["w#shape"].tolist() == [6, 3, 5]


def test_stochastic_rounding_is_seeded_and_unbiased():
    x = torch.full((20000,), 0.3, dtype=torch.float64)
    x[0] = 1.0  # scale = 1/127: 0.3 sits between two levels
    codec = make_codec("int8")
    a = roundtrip(codec, x, seed=5)[1]
    assert torch.equal(a, roundtrip(codec, x, seed=5)[1])  # same seed, same rounding
    assert not torch.equal(a, roundtrip(codec, x, seed=6)[1])
    step = 1 / 127
    assert set((a[1:] / step).round().unique().tolist()) == {38.0, 39.0}  # floor or ceil
    assert float(a[1:].mean()) == pytest.approx(0.3, abs=step / 50)  # unbiased on average
    nearest = roundtrip(codec, x, upload=False)[1]  # downloads round to nearest
    level = round(0.3 * 127) * float(torch.tensor(step, dtype=torch.float32))
    assert torch.equal(nearest[1:], torch.full_like(x[1:], level))


def test_topk_sends_the_largest_magnitudes_ties_to_the_lower_index():
    x = torch.tensor([[0.1, -3.0, 2.0], [2.0, 0.0, -0.5]])
    codec = make_codec("t", {"kind": "topk", "k": 3})
    wire, back = roundtrip(codec, x)
    assert wire["w#indices"].tolist() == [1, 2, 3]  # |-3|, then the tied 2.0s in index order
    assert wire["w#indices"].dtype == torch.int32
    assert wire["w#values"].tolist() == [-3.0, 2.0, 2.0]
    assert torch.equal(back, torch.tensor([[0.0, -3.0, 2.0], [2.0, 0.0, 0.0]]))
    frac = make_codec("topk", {"fraction": 0.01})
    assert frac.count(1000) == 10 and frac.count(5) == 1  # rounds up, at least one


def test_an_update_through_error_feedback_keeps_what_was_left_out():
    codec = make_codec("topk", {"k": 1})
    start = {"w": torch.zeros(3, dtype=torch.float64), "n": torch.tensor(4)}
    trained = {"w": torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64), "n": torch.tensor(5)}
    first = encode_update(codec, start, trained, {}, seed=0, memory=None)
    assert torch.equal(first.decoded["w"], torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64))
    assert torch.equal(first.memory["w"], torch.tensor([0.0, -0.2, 0.1], dtype=torch.float64))
    assert "n" not in first.memory and torch.equal(first.wire["n"], torch.tensor(5))
    # the next round's update plus the memory: [0.05, -0.15, 0.2], 0.2 the largest now
    again = {"w": torch.tensor([0.05, 0.05, 0.1], dtype=torch.float64), "n": torch.tensor(6)}
    second = encode_update(codec, start, again, {}, seed=0, memory=first.memory)
    assert second.decoded["w"].tolist() == pytest.approx([0.0, 0.0, 0.2])
    assert second.memory["w"].tolist() == pytest.approx([0.05, -0.15, 0.0])
    server = apply_update(second.decoded, {"w": torch.ones(3, dtype=torch.float64)}, UPLOAD)
    assert server["w"].tolist() == pytest.approx([1.0, 1.0, 1.2])


# ---- federations --------------------------------------------------------------------------
CASES = {
    "fp16": {},
    "bf16": {},
    "int8": {},  # stochastic rounding, per tensor, both directions
    "int4": {"granularity": "channel", "rounding": "nearest"},
    "int2": {"kind": "quantize", "bits": 2, "directions": ["upload"]},
    "topk": {"fraction": 0.05},  # error feedback
    "topk-noef": {"kind": "topk", "k": 2, "error_feedback": False},  # the head bias has 2
    "fp16-down": {"kind": "cast", "directions": ["download"]},
}
FAST = {
    ("fp16", "fedavg", "full"), ("int8", "fedavg", "full"), ("int4", "fedavg", "full"),
    ("topk", "fedavg", "full"), ("fp16-down", "fedavg", "full"), ("int8", "fedavg", "lora"),
    ("topk", "fedavg", "residual"), ("topk", "scaffold", "full"), ("int8", "fednilo", "full"),
}  # fmt: skip


def _codec_grid():
    cases = []
    for name in CASES:
        for algorithm, adapter in (
            ("fedavg", "full"), ("fedavg", "lora"), ("fedavg", "residual"),
            ("scaffold", "full"), ("fednilo", "full"), ("fedprox", "full"),
        ):  # fmt: skip
            marks = () if (name, algorithm, adapter) in FAST else (pytest.mark.slow,)
            cases.append(
                pytest.param(
                    name, algorithm, adapter, marks=marks, id=f"{name}-{algorithm}-{adapter}"
                )
            )
    return cases


@pytest.mark.parametrize(("name", "algorithm", "adapter"), _codec_grid())
def test_cohort_equals_sequential_for_every_codec(name, algorithm, adapter):
    c = codecs(name, **CASES[name])
    seq = simulate("sequential", algorithm, adapter, codecs=c)
    assert_same(seq, simulate("cohort", algorithm, adapter, codecs=c))
    plain = simulate("sequential", algorithm, adapter)
    # the codec changed what travels (and so the model)
    changed = [k for k in seq[0] if not torch.allclose(seq[0][k], plain[0][k], atol=TOL)]
    assert changed, "the codec changed nothing"
    up = [r.upload_bytes for r in seq[1].rounds]
    down = [r.download_bytes for r in seq[1].rounds]
    plain_up = [r.upload_bytes for r in plain[1].rounds]
    plain_down = [r.download_bytes for r in plain[1].rounds]
    # fewer bytes each round in each direction the codec serves, the same in the other
    # (top-k's indices and per-tensor headers can outweigh what it saves on an adapter's
    # tiny tensors: residual's 27 KB upload takes 44 KB at 5%)
    for ours, theirs, served in ((up, plain_up, c.upload), (down, plain_down, c.download)):
        if served is None:
            assert ours == theirs
        elif adapter == "full":
            assert all(a < b for a, b in zip(ours, theirs, strict=True)), (ours, theirs)
        else:
            assert ours != theirs


def test_reported_bytes_are_the_real_encodings_every_round(monkeypatch):
    """Every upload and download the sequential engine sends is ``payload.encode`` of the
    codec's wire; the bytes the records report are their lengths, round by round, and the
    cohort engine (which counts without serialising) reports the same."""
    sent: list[int] = []
    real = payload.encode

    def spy(state):
        blob = real(state)
        sent.append(len(blob))
        return blob

    c = codecs("int8", granularity="channel")
    monkeypatch.setattr(jobs.payload, "encode", spy)
    sims: list = []
    seq = simulate("sequential", "fedavg", "full", codecs=c, rounds=3, sims=sims)
    monkeypatch.setattr(jobs.payload, "encode", real)
    uploads = [r.upload_bytes for r in seq[2]]
    # one download encoding a round (every client receives it), each client's upload
    downloads = [r.download_bytes // len(r.clients) for r in seq[1].rounds]
    expected = sorted(uploads + downloads)
    assert len(uploads) == 12 and sorted(n for n in sent if n in set(expected)) == expected
    cohort = simulate("cohort", "fedavg", "full", codecs=c, rounds=3)
    for a, b in zip(seq[1].rounds, cohort[1].rounds, strict=True):
        assert (a.upload_bytes, a.download_bytes) == (b.upload_bytes, b.download_bytes)
    # and a client's upload bytes are those of its wire: q (int8) + a scale per channel
    state = {k: v.detach() for k, v in seq[0].items()}
    raw = sims[0].codecs.raw  # BatchNorm's running statistics, sent as they are
    assert raw == {f"bn{i}.{b}" for i in (1, 2) for b in ("running_mean", "running_var",
                                                          "num_batches_tracked")}  # fmt: skip
    wire = encode_state(c.upload, state, upload=True, gen=torch.Generator(), raw=raw)
    assert uploads[0] == len(payload.encode(wire))


def test_error_feedback_memory_survives_dropout_and_resume():
    c = codecs("topk", fraction=0.05)
    sims: list = []
    whole = simulate("sequential", "fedavg", "full", codecs=c, rounds=3, participation=2,
                     sims=sims)  # fmt: skip
    memory = sims[0].codec_memory
    assert len(memory) >= 2 and all(m for m in memory.values())
    assert {r.extra["codec_memory_bytes"] for r in whole[1].rounds[-1:]} == {
        float(sum(payload.tensor_nbytes(m) for m in memory.values()))
    }
    first: list = []
    simulate("sequential", "fedavg", "full", codecs=c, rounds=3, participation=2,
             stop_after=2, sims=first)  # fmt: skip
    ckpt = first[0].state_dict()
    assert ckpt["codec_memory"]
    ckpt["stop_reason"] = "rounds"  # continue it (stop_after ended it as a budget would)
    again = simulate("sequential", "fedavg", "full", codecs=c, rounds=3, participation=2,
                     resume=ckpt)  # fmt: skip
    for k in whole[0]:
        assert torch.equal(whole[0][k], again[0][k]), k


def test_bad_codecs_are_one_line():
    cases = [
        ("zip", None, "unknown; built-in codecs: none, fp16, bf16, int8, int4, topk"),
        ("q", {"kind": "quantize", "bits": 3}, r"q.bits: must be 2, 4 or 8 \(got 3\)"),
        ("topk", {"k": 0}, r"topk.k: must be greater than 0 \(got 0\)"),
        ("topk", {"k": True}, r"topk.k: must be a valid integer \(got True\)"),
        ("topk", {"fraction": 1.5}, r"fraction: must be less than or equal to 1 \(got 1.5\)"),
        ("topk", {"k": 3, "fraction": 0.1}, "topk: give fraction or k, not both"),
        ("topk", {"directions": ["download"]}, "topk cannot serve download"),
        ("topk", {"error_feedback": "yes"}, "error_feedback: must be a valid boolean"),
        ("int8", {"granularity": "row"}, "granularity: must be 'tensor' or 'channel'"),
        ("int8", {"frac": 1}, "unknown option 'frac' for kind quantize"),
        ("fp16", {"directions": ["sideways"]}, "must be 'upload' or 'download' \\(got 'sideways'"),
        ("fp16", {"directions": "upload"}, "fp16.directions: a list of upload, download"),
        ("fp16", {"directions": []}, "fp16.directions: a list of upload, download"),
    ]
    for name, options, message in cases:
        with pytest.raises(ConfigError, match=message):
            make_codec(name, options)
    with pytest.raises(ConfigError, match="k 5000 is above the size of a tensor"):
        simulate("sequential", "fedavg", "full", codecs=codecs("topk", k=5000), rounds=1)
