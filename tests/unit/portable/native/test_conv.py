"""native/conv: the compiled unfold, split and fold give the torch steps' bits."""

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.native import conv as native_conv
from twice.portable.ops import conv as pconv
from unit.portable.bits import (
    CONV_CASES,
    EXAMPLES,
)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@EXAMPLES
@given(case=CONV_CASES, first=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_the_compiled_unfold_and_fold_give_the_torch_steps_bits(case, first, seed):
    """p_conv_forward cuts each column as unfold then p_split does; p_unfold is unfold then
    p_split on given units per row; p_fold_scale is conv.py's fold of integer columns, then the
    scaling and one rounding."""
    gen = torch.Generator().manual_seed(seed)
    channels, kernel = case["cin"] + first, case["kernel"]
    stride, padding, dilation = case["stride"], case["padding"], case["dilation"]
    shape = (case["batch"], channels, *case["size"])
    x = torch.randn(shape, generator=gen, dtype=case["dtype"])
    x = x * torch.exp2(torch.randint(-60, 60, shape, generator=gen)).to(case["dtype"])
    if case["spoil"] is not None:
        x.view(-1)[seed % x.numel()] = case["spoil"]
    w = torch.empty(1, channels, *kernel)
    out_hw = [pconv._out_size(case["size"][i], kernel[i], stride[i], padding[i], dilation[i])
              for i in (0, 1)]  # fmt: skip
    cols = pconv._columns(x, w, stride, padding, dilation)
    area = kernel[0] * kernel[1]
    beta = 1 + seed % 50
    want = native.split_rows(cols[first * area :], (-2,), beta)
    # the forward kernel's columns, through an identity weight into float64: integers * units
    rows, n = (channels - first) * area, case["batch"]
    eye, ones = torch.eye(rows, dtype=torch.float64), torch.ones(rows, dtype=torch.float64)
    out = torch.zeros(n, rows, out_hw[0] * out_hw[1], dtype=torch.float64)
    got = native.module().p_conv_forward(
        src=native.buffer(x), geometry=(*x.shape, *kernel, *stride, *padding, *dilation, *out_hw),
        c0=first, cc=channels - first, beta=beta, wints=native.buffer(eye),
        wunits=native.buffer(ones), m=rows, out=native.buffer(out), out_c=rows, co0=0,
    )  # fmt: skip
    assert got == (want is not False)
    if want:
        ((ints, units),) = want
        assert torch.equal(out, (ints * units).reshape(rows, n, -1).transpose(0, 1))
    if case["spoil"] is None:
        units = torch.exp2(torch.randint(-70, 70, (cols.shape[0],), generator=gen).double())
        given_ = native_conv.columns_given(x, kernel, stride, padding, dilation, out_hw, units)
        assert torch.equal(given_, native.split_given(cols, units))
    ints = torch.randint(-(2**40), 2**40, (case["batch"], channels * area, cols.shape[1] //
                         case["batch"]), generator=gen).double()  # fmt: skip
    unit_b = torch.exp2(torch.randint(-80, 20, (case["batch"],), generator=gen).double())
    folded = pconv._fold(ints, case["size"], kernel, dilation, padding, stride)
    want = (folded * (0.5 * unit_b.reshape(-1, 1, 1, 1))).to(case["dtype"])
    got = native_conv.fold_scaled(ints, case["size"], kernel, stride, padding, dilation, 0.5,
                                  unit_b, case["dtype"])  # fmt: skip
    assert torch.equal(got, want)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_output_channel_count_gives_the_torch_steps_bits(dtype):
    """The forward in cache multiplies the weight's rows 16 at a time, a last block of up to 8
    rows as two tiles of 4: every count of output channels around those widths gives the bits
    of the torch steps (unfold, split, one product, scale), the input gradient at stride 1 too."""
    g = torch.Generator().manual_seed(5)
    settings = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    counts = [(4, m) for m in (1, 4, 7, 8, 9, 12, 16, 17, 24, 25, 33, 48, 53)]
    counts += [(c, 3) for c in (native_conv.INPUT_GRAD_CHANNELS, 50, 57)]  # rows: the input's
    for c, m in counts:
        x = torch.randn(3, c, 7, 9, generator=g, dtype=dtype)
        w = torch.randn(m, c, 3, 3, generator=g, dtype=dtype)
        go = torch.randn(3, m, 7, 9, generator=g, dtype=dtype)
        results = []
        for fallback in (False, True):
            with native.fallback() if fallback else contextlib.nullcontext():
                out = pconv.convolution(x, w, None, *settings)
                grads = pconv.convolution_backward(go, x, w, [m], *settings, [True, True, False])
                results.append((out, *grads[:2]))
        for fast, slow in zip(*results):
            assert torch.equal(fast, slow), m


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@pytest.mark.parametrize("rows", [3, 20])  # the 4-row tiles, and a 16-row block with its tail
def test_scales_beyond_the_band_give_p_scales_bits(rows):
    """p_conv_forward stores a panel as a run where every column's unit times every row's lies
    in scale_by's band, and takes the two-step scaling elsewhere. Float32 inputs never leave
    the band, so the kernel is called directly with units at float64's edges (products below
    the subnormals and above 2**900) for some rows and not others: every output has the bits
    of torch's steps (unfold, round onto each column's unit, one integer product, p_scale)."""
    g = torch.Generator().manual_seed(11)
    n, c, h, w = 2, 3, 4, 9
    cols, area = n * h * w, h * w
    units = torch.ones(cols, dtype=torch.float64)
    units[:area], units[area:] = 2.0**-80, 2.0**150  # one unit a sample: its values' grid
    x = torch.randint(-50, 50, (n, c, h, w), generator=g).to(torch.float64)
    x *= units.reshape(n, 1, h, w)[:, :, :1, :1]
    wints = torch.randint(-9, 9, (rows, c * 9), generator=g).to(torch.float64)
    wunits = 2.0 ** torch.randint(-4, 4, (rows,), generator=g).to(torch.float64)
    wunits[0], wunits[-1] = 2.0**-1000, 2.0**800  # 2**-1080 on sample 0, 2**950 on sample 1
    out, inv = torch.empty(n, rows, h * w, dtype=torch.float64), 1.0 / units
    ok = native.module().p_conv_forward(
        src=native.buffer(x), geometry=(n, c, h, w, 3, 3, 1, 1, 1, 1, 1, 1, h, w), c0=0, cc=c,
        beta=0, wints=native.buffer(wints), wunits=native.buffer(wunits), m=rows,
        out=native.buffer(out), out_c=rows, co0=0, units=native.buffer(units),
        inv=native.buffer(inv),
    )  # fmt: skip
    assert ok
    unfolded = torch.nn.functional.unfold(x, 3, padding=1)  # (n, c 9, h w)
    ints = torch.round(unfolded.permute(1, 0, 2).reshape(c * 9, cols) / units)
    want = native.scaled(wints @ ints, wunits.reshape(-1, 1), units.reshape(1, -1), torch.float64)
    want = want.reshape(rows, n, h * w).transpose(0, 1)
    assert torch.equal(out.view(torch.int64), want.contiguous().view(torch.int64))
