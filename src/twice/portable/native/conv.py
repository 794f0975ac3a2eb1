"""The compiled convolution steps (csrc/conv.c: p_conv_forward, p_conv_weight_grad, p_unfold,
p_fold_scale), where they apply.

`forward` is conv.py's whole forward for one group: the input's columns, each cut on its own
grid, times the weight's integers, with the columns unfolded a panel at a time into a buffer
that stays in cache and multiplied there (no columns in memory), each sum scaled and rounded as
`Repeated`'s product does. `weight_grad` is the weight gradient's integer product of the whole
batch the same way, and `input_grad` the input gradient at stride 1, as the forward of the
output gradient's integers by the flipped weight. Where those do not apply, `columns_given` is
`_columns` followed by `native.split_given` on unfold's columns, and `fold_scaled` conv.py's
`_fold` of integer columns followed by the scaling and the rounding, each one pass. All give the
bits of conv.py's torch steps. As in __init__.py, each returns None where the kernel does not
apply (no compiled module, a tensor not on the CPU or of another dtype), and conv.py then takes
those steps one by one."""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = [
    "forward",
    "weight_grad",
    "input_grad",
    "INPUT_GRAD_CHANNELS",
    "columns_given",
    "fold_scaled",
]


def _kernels(name: str):
    """The compiled module where it has the kernel `name`, else None."""
    module = native.module()
    return module if module is not None and hasattr(module, name) else None


def forward(x, geometry, channels, left, out, co0: int):
    """Channels [co0, co0 + m) of the convolution's output `out` ((N, out channels, Ho * Wo),
    contiguous, x's dtype) from input channels [c0, c0 + count) (`channels`) of the (N, C, H, W)
    input x and `left`, the group's weight cut once (an `exact.Repeated` of (m, count * kh *
    kw) with `parts`): each column on its own grid, as `native.split_rows` cuts unfold's
    columns, times the weight's integers, each sum scaled and rounded once, as `left(columns)`
    gives it. True when done; False where a window holds a value not finite (nothing written);
    None where the kernel does not apply."""
    module = _kernels("p_conv_forward")
    if module is None or left.parts is None:
        return None
    if not native.usable(x, out) or x.dim() != 4 or x.numel() == 0 or out.dtype != x.dtype:
        return None
    if not out.is_contiguous() or out.dim() != 3:
        return None
    kernel, stride, padding, dilation, out_hw = geometry
    ints, units = left.parts
    x, ints = x.contiguous(), ints.to(torch.float64).contiguous()
    units = units.to(torch.float64).contiguous()
    (c0, count), m = channels, ints.shape[0]
    return module.p_conv_forward(
        src=buffer(x), geometry=(*x.shape, *kernel, *stride, *padding, *dilation, *out_hw),
        c0=c0, cc=count, beta=left.beta, wints=buffer(ints), wunits=buffer(units), m=m,
        out=buffer(out), out_c=out.shape[1], co0=co0,
    )  # fmt: skip


def weight_grad(x, geometry, ints_a, units_b):
    """The weight gradient's exact integer product, float64 (m, C * kh * kw), for one group:
    `ints_a` (m, N * Ho * Wo) the output gradient's integers (float64) times the input's
    columns on the rows' units `units_b` (C * kh * kw, fixed over the batch), as
    `torch.matmul(ints_a, columns_given(...).mT)` gives it, with no columns in memory. The
    values must be finite. None where the kernel does not apply."""
    module = _kernels("p_conv_weight_grad")
    if module is None or x.dim() != 4:
        return None
    kernel, stride, padding, dilation, out_hw = geometry
    if not native.usable(x) or ints_a.dtype != torch.float64 or ints_a.dim() != 2:
        return None
    if units_b.numel() != x.shape[1] * kernel[0] * kernel[1]:
        return None
    if ints_a.shape[1] != x.shape[0] * out_hw[0] * out_hw[1]:
        return None
    x, ints_a = x.contiguous(), ints_a.contiguous()
    units_b = units_b.to(torch.float64).contiguous()
    total = native.empty((ints_a.shape[0], units_b.numel()), torch.float64)
    module.p_conv_weight_grad(
        src=buffer(x), geometry=(*x.shape, *kernel, *stride, *padding, *dilation, *out_hw),
        gints=buffer(ints_a), m=ints_a.shape[0], units=buffer(units_b), total=buffer(total),
    )  # fmt: skip
    return total


INPUT_GRAD_CHANNELS = 32
"""From how many input channels (per group) `input_grad` takes the input gradient: each panel's
packing is shared by the input channels' sums, so with few of them torch's float64 kernel is
faster. Measured side by side against it (3x3, 32 samples): on an Intel Xeon (1 / 2 threads)
2.2x its time at 3 channels, 1.1x at 16, even at 32, from 64 0.67x to 1.07x by shape; on an
AMD EPYC with AVX-512 (2 threads), whose MKL runs a slower float64 path, 1.19x at 16 channels,
0.84x to 0.98x at 32 (32x32 and 16x16 images), 0.71x at 64 (8x8)."""


def input_grad(g, weight_part, shape, size, stride, padding, dilation, beta, dtype):
    """conv.py's `_input_grad` at stride 1, in cache: each input is the sum of the weight's
    integers times the output gradient's over every window holding it, which is the forward
    convolution of the output gradient's integers (each sample on its own grid, unit_g) by the
    weight flipped in space with its channels exchanged (integers on one grid, unit_w), padded
    by dilation (k - 1) - padding; each sum times unit_w * unit_g rounded once, as the fold
    gives it. `g` is the output gradient (N, groups, Cout / groups, Ho * Wo), `weight_part` the
    weight's (integers (groups, Cin / groups * kh * kw, Cout / groups), unit), `shape` the
    weight's. None where it does not apply (a stride, a padding wider than the kernel, fewer
    than INPUT_GRAD_CHANNELS input channels, an output gradient under half the input's size,
    whose windows would mostly read padding, a value not finite, no compiled kernel)."""
    module = _kernels("p_conv_forward")
    if module is None or shape[1] < INPUT_GRAD_CHANNELS or dtype not in native.KINDS:
        return None
    kernel = shape[2:]
    spread = [dilation[i] * (kernel[i] - 1) - padding[i] for i in (0, 1)]
    if any(s != 1 for s in stride) or min(spread) < 0 or not native.usable(g):
        return None
    out_hw = [(size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) + 1 for i in (0, 1)]
    if 2 * out_hw[0] * out_hw[1] < size[0] * size[1]:  # most window taps would read padding
        return None
    part = native.split_rows(g, (1, 2, 3), beta)
    if not part:
        return None
    (ints_g, unit_g), (ints_w, unit_w) = part[0], weight_part
    n, groups, cg, _ = g.shape
    cin = shape[1]  # per group
    image = ints_g.reshape(n, groups * cg, *out_hw).contiguous()
    flipped = ints_w.reshape(groups, cin, *kernel, cg).flip(2, 3).permute(0, 1, 4, 2, 3)
    flipped = flipped.reshape(groups, cin, cg * kernel[0] * kernel[1]).contiguous()
    units = unit_g.reshape(n, 1).to(torch.float64).expand(n, size[0] * size[1]).contiguous()
    ones = torch.ones(units.numel(), dtype=torch.float64)
    wunits = unit_w.reshape(1).to(torch.float64).expand(cin).contiguous()
    out = native.empty((n, groups * cin, size[0] * size[1]), dtype)
    geometry = (*image.shape, *kernel, 1, 1, *spread, *dilation, *size)
    for group in range(groups):
        module.p_conv_forward(
            src=buffer(image), geometry=geometry, c0=group * cg, cc=cg, beta=0,
            wints=buffer(flipped[group]), wunits=buffer(wunits), m=cin, out=buffer(out),
            out_c=groups * cin, co0=group * cin, units=buffer(units), inv=buffer(ones),
        )  # fmt: skip
    return out.reshape(n, groups * cin, *size)


def columns_given(x, kernel, stride, padding, dilation, out_hw, units):
    """The integers of every channel's columns of the (N, C, H, W) input on units fixed
    elsewhere, one per row of unfold's matrix (float64, C * kh * kw): round(x / unit), as
    `native.split_given(columns, units)` gives them (p_unfold). The values must be finite.
    None where the kernel does not apply."""
    module = _kernels("p_unfold")
    if module is None or not native.usable(x, units) or x.dim() != 4 or x.numel() == 0:
        return None
    if units.numel() != x.shape[1] * kernel[0] * kernel[1]:
        return None
    x, units = x.contiguous(), units.to(torch.float64).contiguous()
    ints = native.empty(
        (x.shape[1] * kernel[0] * kernel[1], x.shape[0] * out_hw[0] * out_hw[1]), torch.float64
    )
    module.p_unfold(
        src=buffer(x), geometry=(*x.shape, *kernel, *stride, *padding, *dilation, *out_hw),
        ints=buffer(ints), units=buffer(units),
    )  # fmt: skip
    return ints


def fold_scaled(cols, size, kernel, stride, padding, dilation, unit_a, unit_b, out_dtype):
    """conv.py's `_fold` of the integer columns `cols` (float64, (N, C * kh * kw, Ho * Wo)) onto
    inputs of spatial `size`, each sum times `unit_a` (one unit) times its sample's `unit_b`
    (N units), rounded once to `out_dtype`: an (N, C, *size) tensor. None where the kernel does
    not apply."""
    module = _kernels("p_fold_scale")
    if module is None or out_dtype not in native.KINDS or not native.usable(cols, unit_b):
        return None
    if cols.dtype != torch.float64 or cols.dim() != 3 or unit_b.numel() != cols.shape[0]:
        return None
    n, rows = cols.shape[0], cols.shape[1]
    channels = rows // (kernel[0] * kernel[1])
    out_hw = [
        (size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
        for i in (0, 1)
    ]
    if out_hw[0] * out_hw[1] != cols.shape[2]:
        return None
    cols, unit_b = cols.contiguous(), unit_b.to(torch.float64).contiguous()
    out = native.empty((n, channels, *size), out_dtype)
    module.p_fold_scale(
        cols=buffer(cols),
        geometry=(n, channels, *size, *kernel, *stride, *padding, *dilation, *out_hw),
        unit_a=float(unit_a), unit_b=buffer(unit_b), out=buffer(out),
    )  # fmt: skip
    return out
