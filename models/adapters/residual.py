"""``residual``: Rebuffi's parallel residual adapters (seed 000 §III eq. 1, Rebuffi et al. 2018).

Beside every 3x3 convolution W_l sits a 1x1 convolution a_l with the same output channels:
the layer computes W_l * x + a_l * x, and the BatchNorm that follows the convolution in the
backbone normalises the sum (seed 000: "applied on (W_l * x + a_l * x) before the
activation"). The adapters, every BatchNorm layer and the classifier train; the 3x3 kernels
are the frozen base. Adapters start at zero, so the adapted model starts equal to the base.

Written by hand: no library ships these adapters (PEFT's conv tuners are LoRA-style low-rank
updates, not Rebuffi's parallel 1x1 convolutions).

Merge: the centre tap of a 3x3 kernel reads the same input pixel as a 1x1 kernel applied at
the same stride, once both are aligned (``shift`` below; 0 for the usual padding 1), so
W'[:, :, 1, 1] = W[:, :, 1, 1] + a[:, :, 0, 0] gives a plain convolution with the same
output, padding and stride respected.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models.adapters.base import AdapterMethod
from models.adapters.bn_head import bn_and_head

_K = (3, 3)


def centre_shift(conv: nn.Conv2d) -> tuple[int, int]:
    """Input offset of the kernel's centre tap at output pixel 0, per axis:
    dilation * (k - 1) / 2 - padding (0 for a 3x3 conv with padding 1)."""
    (dh, dw), (kh, kw) = conv.dilation, conv.kernel_size
    if conv.padding == "valid":
        ph, pw = 0, 0
    elif conv.padding == "same":  # odd kernel: symmetric padding of the centre offset
        ph, pw = dh * (kh - 1) // 2, dw * (kw - 1) // 2
    else:
        ph, pw = cast(tuple[int, int], conv.padding)
    return dh * (kh - 1) // 2 - ph, dw * (kw - 1) // 2 - pw


def adaptable(conv: nn.Module) -> bool:
    """A plain 3x3 ``nn.Conv2d`` whose centre tap a 1x1 adapter can be folded into.

    Subclasses (e.g. EfficientNet's TensorFlow-style dynamic "same" padding) compute their
    padding in ``forward``, so the alignment below would not hold: they are left alone."""
    if type(conv) is not nn.Conv2d:
        return False
    if tuple(conv.kernel_size) != _K:
        return False
    # With negative shifts the centre tap reads padding, which the adapter pads with zeros.
    return conv.padding_mode == "zeros" or min(centre_shift(conv)) >= 0


class ResidualConv2d(nn.Conv2d):
    """A frozen 3x3 ``nn.Conv2d`` plus a parallel 1x1 adapter (same keys as the conv, plus
    ``adapter_weight`` of shape (C_out, C_in / groups, 1, 1))."""

    def __init__(self, conv: nn.Conv2d) -> None:
        # Built on the meta device (no RNG draw, no memory), then the conv's own tensors.
        super().__init__(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            stride=conv.stride,  # type: ignore[arg-type]
            padding=conv.padding,  # type: ignore[arg-type]
            dilation=conv.dilation,  # type: ignore[arg-type]
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device="meta",
        )
        self.weight = conv.weight
        self.bias = conv.bias
        w = conv.weight
        self.adapter_weight = nn.Parameter(
            torch.zeros(w.shape[0], w.shape[1], 1, 1, dtype=w.dtype, device=w.device)
        )
        self.shift = centre_shift(conv)

    def adapter(self, x: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
        """a_l * x at the centre taps of the 3x3 conv's output grid (B, C_out, H', W')."""
        sh, sw = self.shift
        if sh > 0 or sw > 0:
            x = x[..., max(sh, 0) :, max(sw, 0) :]
        if sh < 0 or sw < 0:
            ph, pw = max(-sh, 0), max(-sw, 0)
            x = F.pad(x, (pw, pw, ph, ph))
        z = F.conv2d(x, self.adapter_weight, stride=self.stride, groups=self.groups)
        return z[..., : out_hw[0], : out_hw[1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)  # W_l * x, (B, C_out, H', W')
        return y + self.adapter(x, (y.shape[-2], y.shape[-1]))  # seed 000 eq. 1, before BN

    def merged(self) -> nn.Conv2d:
        """A plain conv with the adapter folded into the centre tap."""
        conv = nn.Conv2d(
            self.in_channels,
            self.out_channels,
            self.kernel_size,  # type: ignore[arg-type]
            stride=self.stride,  # type: ignore[arg-type]
            padding=self.padding,  # type: ignore[arg-type]
            dilation=self.dilation,  # type: ignore[arg-type]
            groups=self.groups,
            bias=self.bias is not None,
            padding_mode=self.padding_mode,
            device="meta",
        )
        ch, cw = (k // 2 for k in self.kernel_size)
        with torch.no_grad():
            w = self.weight.detach().clone()
            w[:, :, ch, cw] += self.adapter_weight[:, :, 0, 0]
        conv.weight = nn.Parameter(w)
        if self.bias is not None:
            conv.bias = nn.Parameter(self.bias.detach().clone())
        conv.train(self.training)
        return conv


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


class Residual(AdapterMethod):
    name = "residual"
    summary = "Rebuffi's parallel 1x1 adapters beside every 3x3 conv, + BatchNorm and head"

    def applies_to(self, model: nn.Module) -> str | None:
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        if any(adaptable(m) for m in convs):
            return None
        kernels = sorted({"x".join(map(str, m.kernel_size)) for m in convs})
        return "it has no plain 3x3 nn.Conv2d" + (
            f" (its convolutions are {', '.join(kernels)})" if kernels else ""
        )

    def add_modules(self, model: nn.Module) -> None:
        for name, m in list(model.named_modules()):
            if adaptable(m):
                _replace(model, name, ResidualConv2d(m))  # type: ignore[arg-type]

    def trainable_names(self, model: nn.Module) -> set[str]:
        adapters = {n for n, _ in model.named_parameters() if n.endswith("adapter_weight")}
        return adapters | bn_and_head(model)

    def fold(self, model: nn.Module) -> None:
        for name, m in list(model.named_modules()):
            if isinstance(m, ResidualConv2d):
                _replace(model, name, m.merged())
