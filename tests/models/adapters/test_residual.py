"""The residual adapter (models/adapters/residual.py): centre-tap alignment for every
padding/stride/dilation a 3x3 conv can have, and which convs it adapts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.adapters.residual import ResidualConv2d, adaptable, centre_shift

CONVS = {  # name: Conv2d keyword arguments (3x3, zero padding)
    "pad1": {"padding": 1},
    "pad0": {"padding": 0},
    "valid": {"padding": "valid"},
    "same-dil2": {"padding": "same", "dilation": 2},
    "pad2": {"padding": 2},
    "stride2": {"padding": 1, "stride": 2},
    "dil2-pad1": {"padding": 1, "dilation": 2},
    "groups2": {"padding": 1, "groups": 2},
    "pad1x0": {"padding": (1, 0)},  # asymmetric: crop one axis only
    "pad2x1": {"padding": (2, 1)},  # asymmetric: pad one axis only
    "pad0x1": {"padding": (0, 1)},
    "pad1x2": {"padding": (1, 2)},
    "dil1x2-pad1": {"padding": 1, "dilation": (1, 2)},
}


SHIFTS = {  # dilation * (k - 1) / 2 - padding, by hand
    "pad1": (0, 0),
    "pad0": (1, 1),
    "valid": (1, 1),
    "same-dil2": (0, 0),
    "pad2": (-1, -1),
    "stride2": (0, 0),
    "dil2-pad1": (1, 1),
    "groups2": (0, 0),
    "pad1x0": (0, 1),
    "pad2x1": (-1, 0),
    "pad0x1": (1, 0),
    "pad1x2": (0, -1),
    "dil1x2-pad1": (0, 1),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_residual_adapter_is_a_conv_with_only_the_centre_tap(name):
    """y = W*x + a*x with a at the 3x3 kernel's centre tap: checked against F.conv2d with a
    kernel that is zero except its centre (an independent reference), and merged = unmerged."""
    kw = CONVS[name]
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, bias=True, dtype=torch.float64, **kw)
    assert centre_shift(conv) == SHIFTS[name]
    assert adaptable(conv)
    res = ResidualConv2d(conv)
    with torch.no_grad():
        res.adapter_weight.normal_()
    x = torch.randn(2, 4, 11, 9, dtype=torch.float64)
    centre = torch.zeros_like(conv.weight)
    centre[:, :, 1, 1] = res.adapter_weight[:, :, 0, 0]
    want = conv(x) + F.conv2d(
        x,
        centre,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
    )
    got = res(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.merged()(x), want, rtol=0, atol=1e-12)


def test_which_convs_take_a_residual_adapter():
    class Dynamic(nn.Conv2d):  # computes its padding in forward (EfficientNet style)
        pass

    assert adaptable(nn.Conv2d(2, 2, 3, padding=1)) is True
    assert adaptable(nn.Conv2d(2, 2, 1)) is False
    assert adaptable(nn.Conv2d(2, 2, 5, padding=2)) is False
    assert adaptable(Dynamic(2, 2, 3, padding=1)) is False
    assert adaptable(nn.Linear(2, 2)) is False
    # reflect padding: fine where the centre tap never reads padding, refused where it does
    assert adaptable(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")) is True
    assert adaptable(nn.Conv2d(2, 2, 3, padding=2, padding_mode="reflect")) is False
    assert adaptable(nn.Conv2d(2, 2, 3, padding=2, padding_mode="zeros")) is True
