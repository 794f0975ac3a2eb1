"""ops/conv: convolutions as accurate as torch in float64, with the same bits whatever the
chunk of samples unfolded at once, and torch's input-gradient kernel used only where it is a
sum of products."""

import math

import pytest
import torch
from hypothesis import given

from twice.portable import native
from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.native import conv as native_conv
from twice.portable.ops import conv as pconv
from unit.portable.bits import (
    CONV_CASES,
    EXAMPLES,
    F64,
    compiled_kernels,
    gen,
    same_bits,
)


def test_convolutions_and_their_gradients_match_torch_in_float64():
    g = gen(6)
    close = {"rtol": 1e-12, "atol": 1e-12}
    img = torch.randn(2, 3, 9, 8, generator=g, dtype=F64)
    w = torch.randn(5, 3, 3, 3, generator=g, dtype=F64)
    ours = pconv.convolution(img, w, None, [2, 1], [1, 0], [1, 2], False, [0, 0], 1)
    ref = torch.nn.functional.conv2d(img, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    assert torch.allclose(ours, ref, **close)
    go = torch.randn(ref.shape, generator=g, dtype=F64)
    settings = ([2, 1], [1, 0], [1, 2], False, [0, 0], 1, [True, True, True])
    grads = pconv.convolution_backward(go, img, w, [5], *settings)
    expected = torch.ops.aten.convolution_backward(go, img, w, [5], *settings)
    for mine, theirs in zip(grads, expected):
        assert torch.allclose(mine, theirs, **close)
    wg = torch.randn(6, 1, 3, 3, generator=g, dtype=F64)
    grouped = pconv.convolution(img, wg, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 3)
    ref = torch.nn.functional.conv2d(img, wg, padding=1, groups=3)
    assert torch.allclose(grouped, ref, **close)


@EXAMPLES
@given(case=CONV_CASES)
def test_a_convolution_has_the_same_bits_whatever_its_chunk(case):
    g = case["groups"]
    torch.manual_seed(0)
    scales = torch.logspace(-3, 3, case["batch"], dtype=case["dtype"]).reshape(-1, 1, 1, 1)
    x = torch.randn(case["batch"], g * case["cin"], *case["size"], dtype=case["dtype"]) * scales
    if case["spoil"] is not None:
        x[0, 0, 0, 0] = case["spoil"]
    w = torch.randn(g * case["cout"], case["cin"], *case["kernel"], dtype=case["dtype"])
    b = torch.randn(g * case["cout"], dtype=case["dtype"])
    settings_ = (case["stride"], case["padding"], case["dilation"], False, (0, 0), g)
    if case["spoil_weight"]:
        w[-1, 0, 0, 0] = math.inf
    results = []
    # the compiled kernels in cache; columns unfolded a sample at a time, or the whole batch in
    # one chunk (torch's float64 kernel for the input gradient), the input gradient's columns as
    # a product per sample or one product over the chunk; and the torch steps one by one
    many, one = 0, 1 << 40  # pconv.ONE_PRODUCT_BELOW
    routes = ((1, True, True, many), (1, True, False, many), (1, True, False, one))
    routes += ((1 << 40, True, False, many), (1 << 40, True, False, one), (1, False, False, one))
    kernels = ("forward", "weight_grad", "input_grad")
    seen = {name: [] for name in kernels}

    def spy(name, kernel=None):
        kernel = getattr(native_conv, name)

        def spied(*args):
            seen[name].append(kernel(*args))
            return seen[name][-1]

        return spied

    spies = {name: spy(name) for name in kernels}
    for chunk, compiled, in_cache, below in routes:
        with pytest.MonkeyPatch.context() as patch, compiled_kernels(compiled):
            patch.setattr(pconv, "COLUMN_CHUNK", chunk)
            patch.setattr(pconv, "ONE_PRODUCT_BELOW", below)
            patch.setattr(pconv, "WHOLE_WEIGHT_GRAD", 2 * chunk)
            patch.setattr(native_conv, "INPUT_GRAD_CHANNELS", 1)  # any count takes it
            for name in kernels:
                patch.setattr(native_conv, name, spies[name] if in_cache else lambda *a: None)
            out = pconv.convolution(x, w, b, *settings_)
            grad = torch.linspace(-2, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
            back = pconv.convolution_backward(grad, x, w, [w.shape[0]], *settings_, [True] * 3)
        results.append([out, *back])
    finite = case["spoil"] is None and not case["spoil_weight"]
    if native.available() and case["dtype"] == torch.float32 and finite:  # in cache, taken
        assert seen["forward"] and all(seen["forward"])
        assert g > 1 or all(t is not None for t in seen["weight_grad"])
        spread = [d * (k - 1) - p for d, k, p in zip(case["dilation"], case["kernel"],
                                                     case["padding"])]  # fmt: skip
        half = 2 * results[0][0][0, 0].numel() >= x[0, 0].numel()  # most taps inside
        if case["stride"] == (1, 1) and min(spread) >= 0 and half:
            assert seen["input_grad"] and all(t is not None for t in seen["input_grad"])
    for first, *others in zip(*results):
        assert all(same_bits(first, other) for other in others)
    # the weight's gradient, summed a few samples at a time on grids fixed over the batch, is
    # the one exact product of the whole batch's columns
    n, cout = x.shape[0], w.shape[0]
    columns = torch.nn.functional.unfold(x, case["kernel"], case["dilation"], case["padding"],
                                         case["stride"])  # fmt: skip
    k, length = columns.shape[1] // g, columns.shape[2]
    a = grad.reshape(n, g, cout // g, length).permute(1, 2, 0, 3).reshape(g, cout // g, -1)
    b = columns.reshape(n, g, k, length).permute(1, 0, 3, 2).reshape(g, n * length, k)
    assert same_bits(results[0][2], exact_matmul(a, b, x.dtype).reshape(w.shape))


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
def test_torch_computes_the_input_gradient_only_with_a_kernel_of_sums_of_products(monkeypatch):
    """Torch's own float64 convolution backward takes the integer slices only where it would
    pick Slow2d or SlowDilated2d; any other kernel (Winograd, NNPACK, one torch adds later) is
    never asked, and the fold gives the same bits."""
    torch.manual_seed(3)
    x, w = torch.randn(4, 3, 9, 9), torch.randn(5, 3, 3, 3)
    grad = torch.randn(4, 5, 9, 9)
    settings_ = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False])
    calls = []
    real = torch.ops.aten.convolution_backward

    class Counting:
        def __call__(self, *args):
            calls.append(args[0].dtype)
            return real(*args)

    monkeypatch.setattr(torch.ops.aten, "convolution_backward", Counting())
    monkeypatch.setattr(native_conv, "input_grad", lambda *a: None)  # the route in cache off
    by_torch = pconv.convolution_backward(grad, x, w, None, *settings_)[0]
    assert calls == [torch.float64]  # torch's kernel took the integers
    for other in (torch._C._ConvBackend.Winograd3x3Depthwise, torch._C._ConvBackend.Mkldnn):
        calls.clear()
        monkeypatch.setattr(torch._C, "_select_conv_backend", lambda *a, other=other: other)
        by_fold = pconv.convolution_backward(grad, x, w, None, *settings_)[0]
        assert calls == []
        assert torch.equal(by_fold, by_torch)


@pytest.mark.parametrize("spatial", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_one_value_stands_for_every_spatial_dimension_as_aten_takes_it(spatial, transposed):
    """aten.convolution takes one stride, padding, dilation or output padding for all spatial
    dimensions (`padding="valid"` arrives as `[0]`): forward and backward give torch's shapes
    and, in float64, torch's values."""
    g = gen(spatial)
    x = torch.randn(2, 2, *[7 - d for d in range(spatial)], generator=g, dtype=F64)
    w = torch.randn(*((2, 3) if transposed else (3, 2)), *[2] * spatial, generator=g, dtype=F64)
    settings = ([2], [0], [1], transposed, [1] if transposed else [0], 1)
    expected = torch.ops.aten.convolution(x, w, None, *settings)
    found = pconv.convolution(x, w, None, *settings)
    assert found.shape == expected.shape
    assert torch.allclose(found, expected, rtol=1e-12, atol=1e-12)
    go = torch.randn(expected.shape, generator=g, dtype=F64)
    mask = [True, True, False]
    ours = pconv.convolution_backward(go, x, w, None, *settings, mask)
    theirs = torch.ops.aten.convolution_backward(go, x, w, None, *settings, mask)
    for mine, torchs in zip(ours[:2], theirs[:2]):
        assert torch.allclose(mine, torchs, rtol=1e-12, atol=1e-12)


def test_a_window_in_the_padding_gives_the_same_zero_on_every_route():
    """Outputs whose windows lie wholly in the padding are sums of no value: +0 on the compiled
    route and the torch one alike (ZERO_SIGN), whatever the weights' signs, 1x1 kernels and
    wider, strided and dilated; in float64 the sum of the weights times the padding's zeros in
    k's order (arithmetic/ordered.py), the same zero on both routes."""
    from twice.portable import native

    g = torch.Generator().manual_seed(3)
    for kernel, stride, padding, dilation in [((1, 1), [2, 2], [4, 4], [1, 2]),
                                              ((3, 1), [1, 3], [3, 2], [2, 1])]:  # fmt: skip
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(2, 2, 3, 7, generator=g, dtype=dtype)
            w = -torch.rand(3, 2, *kernel, generator=g, dtype=dtype)
            args = (None, stride, padding, dilation, False, [0, 0], 1)
            compiled = pconv.convolution(x, w, *args)
            with native.fallback():
                plain = pconv.convolution(x, w, *args)
            assert same_bits(compiled, plain), (kernel, dtype)
            if dtype == torch.float32:
                assert not compiled[compiled == 0].signbit().any()
