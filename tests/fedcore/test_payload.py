"""What crosses the simulated network: ``payload.encoded_size`` is ``len(encode(...))``.

The cohort engine counts bytes without serialising every client's values (``encoded_size``
encodes once per structure); these tests hold it to real encodings for every structure the
engine produces: dtypes, shapes, scalars, empty tensors, views into a larger storage (saved
with the whole storage), shared storages, non-contiguous tensors, and values that differ.
"""

from __future__ import annotations

import pytest
import torch

from fedcore import payload
from fedcore.client import ImageData
from tests.helpers import tiny_cnn


def structures() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    stack = torch.randn(5, 300, generator=g)  # a cohort's stacked tensor
    return [
        tiny_cnn().state_dict(),
        {"w": torch.randn(128, 1000, generator=g).half(), "n": torch.tensor(7)},
        {"scalar": torch.tensor(1.5), "empty": torch.zeros(0), "i": torch.arange(3)},
        {"row": stack[2]},  # a view: torch.save writes the whole storage
        {"row": stack[4], "other": stack[0]},  # two views of one storage: written once
        {"col": stack[:, 1]},  # non-contiguous: encode copies it
        {"a": stack, "b": stack},  # one tensor under two names
        {"__message__.c": torch.ones(3, 3, dtype=torch.float64), "x": torch.zeros(2, 2)},
    ]


@pytest.mark.parametrize("i", range(len(structures())))
def test_encoded_size_is_the_real_encoding(i):
    state = structures()[i]
    assert payload.encoded_size(state) == len(payload.encode(state))
    # Other values, same structure: the remembered size is still the real one.
    other = {k: (v * 3 + 1).to(v.dtype) if v.numel() else v for k, v in state.items()}
    assert payload.encoded_size(other) == len(payload.encode(other))


def test_encoded_size_tells_structures_apart():
    # (storages are aligned to 64 bytes: sizes a few elements apart can encode alike)
    a = {"w": torch.zeros(100, 10)}
    assert payload.encoded_size(a) != payload.encoded_size({"w": torch.zeros(100, 11)})
    assert payload.encoded_size(a) != payload.encoded_size({"w": torch.zeros(100, 10).double()})
    assert payload.encoded_size({"w": torch.zeros(100)[10:20]}) == len(
        payload.encode({"w": torch.zeros(100)[10:20]})
    )


def test_payload_overhead_is_measured_not_assumed():
    lin = torch.nn.Linear(3, 2)
    state = lin.state_dict()
    assert payload.tensor_nbytes(state) == (3 * 2 + 2) * 4  # hand-computed float32 bytes
    blob = payload.encode(state)
    assert len(blob) > payload.tensor_nbytes(state)  # container overhead exists...
    decoded = payload.decode(blob)
    assert all(torch.equal(decoded[k], state[k]) for k in state)  # ...and is lossless
    big = tiny_cnn().state_dict()
    overhead = len(payload.encode(big)) - payload.tensor_nbytes(big)
    assert 0 < overhead < 2000 * len(big)  # a bounded per-tensor cost (README reports the figure)


def test_device_resident_images_keep_every_tensor_on_their_device():
    """ImageData.to(device): batches are gathered, converted and normalised there. The meta
    device computes no values but refuses to mix devices, as CUDA does: every index, noise
    draw and statistic must follow the images."""
    d = ImageData(
        torch.zeros(20, 1, 6, 6, dtype=torch.uint8), torch.arange(20) % 2, (0.5,) * 3, (0.25,) * 3,
        size=8, channels=3,
    )  # fmt: skip
    assert d.to("cpu") is d
    meta = d.to("meta")
    assert meta.images.device.type == "meta" and d.images.device.type == "cpu"
    g = torch.Generator().manual_seed(1)
    x, y = meta.batch(torch.tensor([3, 1, 4]), noise_var=0.1, generator=g, device="meta")
    assert x.device.type == y.device.type == "meta"
    assert tuple(x.shape) == (3, 3, 8, 8) and tuple(y.shape) == (3,)


def test_is_finite_reads_back_once_and_finds_every_kind_of_bad_value():
    big = torch.full((1000,), 3.0e38)  # finite float32 whose float32 sum would overflow
    assert payload.is_finite({"w": big, "n": torch.tensor(3)})
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = big.clone()
        w[7] = bad
        assert not payload.is_finite({"ok": torch.ones(3), "w": w})
    mixed = torch.tensor([float("inf"), -float("inf"), 1.0])  # +Inf + -Inf: NaN, still caught
    assert not payload.is_finite({"w": mixed})
    assert payload.is_finite({"i": torch.arange(4)})  # no float tensor: nothing to reject


def test_fresh_size_of_a_row_of_a_stack_is_the_size_of_its_own_copy():
    stack = {"w": torch.randn(5, 30, 4), "b": torch.randn(5, 4).double()}
    row = payload.Row(stack, 3)
    own = {k: v.clone() for k, v in row.items()}
    assert payload.encoded_size(row, fresh=True) == len(payload.encode(own))
    assert len(payload.encode(dict(row))) > len(payload.encode(own))  # a view saves the stack
    assert torch.equal(row["w"], stack["w"][3]) and list(row) == ["w", "b"] and len(row) == 2
