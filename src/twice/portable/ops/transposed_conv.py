"""Transposed convolutions in portable mode (conv.py sends them here): a transposed convolution
by W is the gradient, with respect to its input, of the unpadded ordinary convolution by W
whose output gradient is its input, cropped by the padding and extended by the output padding;
its backward is an ordinary convolution and that convolution's weight gradient. `planar` is
conv.py's (convolution, convolution_backward)."""

from __future__ import annotations

import torch

from twice.portable.arithmetic.exact import exact_sum

__all__ = ["forward", "backward"]


def _full_sizes(x, weight, stride, dilation):
    """The transposed convolution's output before padding crops it and output padding extends
    it: (H - 1) stride + dilation (K - 1) + 1 per spatial dimension."""
    return [
        (x.shape[2 + i] - 1) * stride[i] + dilation[i] * (weight.shape[2 + i] - 1) + 1
        for i in range(x.dim() - 2)
    ]


def _crop(t, padding, sizes, full):
    """The positions [p, p + size) of each spatial dimension of `t` (length `full`): crops where
    padding removes them, zeros where output padding goes past the full output."""
    pads = []
    for p, size, length in reversed(list(zip(padding, sizes, full))):
        pads += [-p, p + size - length]
    return torch.nn.functional.pad(t, pads)


def forward(x, weight, bias, stride, padding, dilation, out_pad, groups, planar):
    """conv_transpose(x, W): the gradient, with respect to its input, of the unpadded
    convolution by W whose output gradient is x (exact), cropped by the padding and extended by
    the output padding, plus the bias (one addition)."""
    spatial = x.dim() - 2
    full = _full_sizes(x, weight, stride, dilation)
    like = torch.empty(
        (x.shape[0], weight.shape[1] * groups, *full), dtype=x.dtype, device=x.device
    )
    zeros = [0] * spatial
    whole, _, _ = planar[1](
        x, like, weight, None, stride, zeros, dilation, False, zeros, groups, [True, False, False]
    )
    sizes = [full[i] - 2 * padding[i] + out_pad[i] for i in range(spatial)]
    out = _crop(whole, padding, sizes, full)
    if bias is not None:
        out = out + bias.reshape(1, -1, *([1] * spatial))
    return out


def backward(go, x, weight, stride, padding, dilation, groups, mask, planar):
    """The backward of `forward`: the output's gradient placed back in the full output (the
    inverse crop), then the unpadded ordinary convolution by W gives the input's gradient, and
    its weight gradient, with input and output gradient exchanged, the weight's."""
    spatial = x.dim() - 2
    full = _full_sizes(x, weight, stride, dilation)
    pads = []
    for p, size, length in reversed(list(zip(padding, go.shape[2:], full))):
        pads += [p, length - p - size]
    whole = torch.nn.functional.pad(go, pads)
    zeros = [0] * spatial
    gi = gw = gb = None
    if mask[0]:
        gi = planar[0](whole, weight, None, stride, zeros, dilation, False, zeros, groups)
    if mask[1]:
        _, gw, _ = planar[1](x, whole, weight, None, stride, zeros, dilation, False,
                                        zeros, groups, [False, True, False])  # fmt: skip
    if mask[2]:
        gb = exact_sum(go, (0, *range(2, go.dim())), False, go.dtype)
    return gi, gw, gb
