"""native/products: the compiled float64 product in k's order (csrc/ordered.c) gives the torch
loop's bits (arithmetic/ordered.py) over generated shapes, layouts, values and thread counts;
what it does not take it declines. Its twin for integer slices (p_integer_mm) gives
torch.matmul's exact sums."""

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from twice.portable.arithmetic.exact import beta_for
from twice.portable.arithmetic.ordered import ordered_loop
from twice.portable.native import products
from unit.portable.bits import EXAMPLES, F64, gen, needs_native, same_bits


def test_the_kernel_declines_what_it_does_not_take():
    x = torch.randn(3, 4, dtype=F64)
    assert products.ordered_mm(x.float(), x.t().float()) is None  # float64 only
    assert products.ordered_mm(x[0], x.t()) is None  # matrices (ordered.py takes vectors)
    assert products.ordered_mm(x[:, :0], x.t()[:0]) is None  # no term: ordered.py's +0
    assert products.ordered_mm(x, x) is None  # shapes that do not multiply
    assert products.gpu_ordered_mm(x, x.t()) is None  # a CPU tensor: not the Triton kernel


# Where the kernel's blocks end: 6 rows a panel, 16 columns, 256 values of k.
_SIZES = st.sampled_from([1, 2, 5, 6, 7, 12, 13, 16, 17, 31, 33])
_INNER = st.sampled_from([1, 2, 3, 15, 16, 17, 255, 256, 257, 300, 513])
# how an operand is laid out: contiguous, transposed, every other column, a broadcast row
_LAYOUTS = st.sampled_from(["contiguous", "transposed", "strided", "broadcast"])
# what its values are: random, with an infinity and a NaN, near overflow (running sums overflow
# and cancel), subnormal, signed zeros only
_VALUES = st.sampled_from(["random", "nonfinite", "huge", "subnormal", "zeros"])


def _draw(g, shape, layout, values):
    rows, cols = shape[-2:]
    x = torch.randn(*shape, generator=g, dtype=F64)
    if values == "nonfinite":
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=g))] = math.inf
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=g))] = math.nan
    elif values == "huge":
        x = x * 1e308
    elif values == "subnormal":
        x = x * 1e-310
    elif values == "zeros":
        x = torch.where(x > 0, 0.0, -0.0).to(F64)
    if layout == "transposed":
        return x.mT.contiguous().mT
    if layout == "strided":
        wide = torch.zeros(*shape[:-1], 2 * cols, dtype=F64)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "broadcast":
        return x[..., :1, :].expand(*shape)
    return x


@needs_native
@EXAMPLES
@given(
    _SIZES, _INNER, _SIZES, st.sampled_from([(), (2,), (3, 1)]), _LAYOUTS, _LAYOUTS, _VALUES,
    _VALUES, st.sampled_from([1, 2]), st.integers(0, 2**31),
)  # fmt: skip
def test_the_kernel_gives_the_loops_bits(m, k, n, batch, layout_a, layout_b, va, vb, threads, seed):
    """Every output element's sum in k's order, whatever the blocking, the tails, a single row or
    column (the vector routes), the strides, a broadcast batch (a batch of 3x1 against one of 2
    on the other side, one matrix for a batch), the values (NaN where the loop gives NaN, an
    infinity, a zero's sign) and the thread count."""
    g = gen(seed)
    a = _draw(g, (*batch, m, k), layout_a, va)
    b_batch = {(3, 1): (2,), (2,): () if seed % 2 else (2,)}.get(batch, batch)  # 2-d: shared
    b = _draw(g, b_batch + (k, n), layout_b, vb)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = products.ordered_mm(a, b)
    finally:
        torch.set_num_threads(before)
    assert same_bits(got, ordered_loop(a, b)), (a.shape, b.shape, a.stride(), b.stride())


@needs_native
def test_every_nan_is_the_one_quiet_nan_on_every_route():
    """x86 makes a negative NaN of inf * 0 or inf - inf, ARM and CUDA a positive one: a float64
    product writes `math.nan`'s bits, through the tiles, the vector routes and the torch loop."""
    from twice.portable.arithmetic.ordered import ordered_matmul
    from unit.portable.bits import both

    nan_bits = torch.tensor([math.nan], dtype=F64).view(torch.int64)
    shapes = [((7, 3), (3, 17)), ((1, 3), (3, 5)), ((5, 3), (3, 1)), ((4, 1), (1, 4))]
    for a_shape, b_shape in shapes:
        a = torch.ones(*a_shape, dtype=F64)
        b = torch.ones(*b_shape, dtype=F64)
        a[0, 0], b[0, 0] = math.inf, 0.0  # inf * 0
        for out in both(lambda a=a, b=b: ordered_matmul(a, b)):
            bits = out.view(torch.int64)[out.isnan()]
            assert bits.numel() and bool((bits == nan_bits).all()), (a_shape, b_shape)


@needs_native
def test_the_workers_flush_denormals_as_the_calling_thread_does():
    """torch.set_flush_denormal sets the calling thread's mode alone; the compiled kernels'
    workers (torch's OpenMP threads) take the caller's mode for each call, so a product whose
    terms are subnormal, or an exp that underflows, has the same bits at any thread count."""
    from twice.portable import native

    g = gen(7)
    a = torch.rand(120, 64, generator=g, dtype=F64) * 1e-154 + 1e-155
    b = torch.rand(64, 300, generator=g, dtype=F64) * 1e-154
    x = -700.0 - torch.rand(200_000, generator=g, dtype=F64) * 40
    before = torch.get_num_threads()
    results = {}
    try:
        for flush in (True, False):
            torch.set_flush_denormal(flush)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                results[flush, threads] = (products.ordered_mm(a, b), native.unary("exp", x))
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)
    for flush in (True, False):
        for one, two in zip(results[flush, 1], results[flush, 2]):
            assert same_bits(one, two), flush
    assert not torch.equal(results[True, 1][0], results[False, 1][0])  # the mode took effect


def test_a_lazily_negated_view_is_read_as_its_values():
    """A view whose negation torch has not applied (the imaginary part of a conjugate) is not
    read from memory by a kernel: the product is the loop's of its values."""
    from twice.portable import native
    from twice.portable.arithmetic.ordered import ordered_matmul

    z = torch.randn(3, 5, generator=gen(8), dtype=torch.complex128)
    view = z.conj().imag
    assert view.is_neg() and not native.usable(view)
    w = torch.randn(5, 4, generator=gen(9), dtype=F64)
    assert same_bits(ordered_matmul(view, w), ordered_loop(view.clone(), w))


# What an integer slice holds: values on both sides of zero, every one at the largest magnitude
# exact.py's bound allows (the running sums reach 2**53), signed zeros only, and sparse ones.
_INTEGERS = st.sampled_from(["random", "largest", "zeros", "sparse"])


def _integers(g, shape, layout, values):
    """Float64 integers below exact.py's bound for a product of shape[-1] terms, laid out as
    _draw lays them out."""
    k = shape[-1]
    top = 2.0 ** beta_for(k, 2)
    if values == "largest":
        x = torch.where(torch.rand(*shape, generator=g) < 0.5, -top, top).to(F64)
    elif values == "zeros":
        x = torch.where(torch.rand(*shape, generator=g) < 0.5, 0.0, -0.0).to(F64)
    else:
        x = torch.randint(-int(top), int(top) + 1, shape, generator=g).to(F64)
        if values == "sparse":
            x = torch.where(torch.rand(*shape, generator=g) < 0.9, -0.0, x)
    return _draw_layout(x, layout)


def _draw_layout(x, layout):
    if layout == "transposed":
        return x.mT.contiguous().mT
    if layout == "strided":
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=F64)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "broadcast":
        return x[..., :1, :].expand(*x.shape)
    return x


def _canonical(x):
    """The bits of x + 0.0: exact.py's ZERO_SIGN, which every caller applies before scaling."""
    return (x + 0.0).view(torch.int64)


@needs_native
@EXAMPLES
@given(
    _SIZES, _INNER, st.sampled_from([1, 5, 16, 17, 33, 130, 300]), st.sampled_from([(), (2,)]),
    _LAYOUTS, _LAYOUTS, _INTEGERS, _INTEGERS, st.sampled_from([1, 2]), st.integers(0, 2**31),
)  # fmt: skip
def test_the_integer_kernel_gives_the_exact_sums(m, k, n, batch, la, lb, va, vb, threads, seed):
    """p_integer_mm fuses each multiply and add: on integer slices (every partial sum exact,
    up to 2**53) it gives torch.matmul's exact sums, bit for bit once a zero's sign is made
    +0, whatever the tiles, the column groups the threads share, the k blocks and the
    layouts."""
    g = gen(seed)
    a = _integers(g, (*batch, m, k), la, va)
    b = _integers(g, (*batch, k, n), lb, vb) if seed % 2 else _integers(g, (k, n), lb, vb)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = products.integer_mm(a, b)
        into = torch.full(got.shape, math.nan, dtype=F64)
        assert products.integer_mm(a, b, out=into) is into
    finally:
        torch.set_num_threads(before)
    want = torch.matmul(a, b)
    assert torch.equal(_canonical(got), _canonical(want)), (a.shape, b.shape, a.stride())
    assert torch.equal(_canonical(into), _canonical(want))


def test_the_integer_kernel_declines_what_it_does_not_take():
    x = torch.ones(3, 4, dtype=F64)
    assert products.integer_mm(x.float(), x.t().float()) is None  # float64 only
    assert products.integer_mm(x, x.t(), out=torch.empty(3, 4, dtype=F64)) is None  # its shape
    assert products.integer_mm(x, x.t(), out=torch.empty(3, 3)) is None  # float64 out only
    assert products.integer_mm(x, x.t(), out=torch.empty(3, 6, dtype=F64)[:, ::2]) is None


@needs_native
def test_the_integer_product_takes_the_faster_route_with_the_same_bits(monkeypatch):
    """integer_product times p_integer_mm against torch's product once a thread count and takes
    the faster: either route gives the same bits (out= too), and with the kernels turned off it
    is torch's, without keeping that answer for when they are back."""
    from twice.portable import native

    g = gen(3)
    top = 2 ** beta_for(300, 2)
    a = torch.randint(-top, top, (13, 300), generator=g).to(F64)
    b = torch.randint(-top, top, (300, 37), generator=g).to(F64)
    assert isinstance(products.faster_than_torch(), bool)
    assert torch.get_num_threads() in products._FASTER
    results = []
    for faster in (True, False):
        monkeypatch.setitem(products._FASTER, torch.get_num_threads(), faster)
        into = torch.full((13, 37), math.nan, dtype=F64)
        assert products.integer_product(a, b, out=into) is into
        results += [products.integer_product(a, b), into]
    for got in results:
        assert torch.equal(_canonical(got), _canonical(results[0]))
    monkeypatch.setattr(products, "_FASTER", {})
    with native.fallback():
        assert products.faster_than_torch() is False
    assert products._FASTER == {}


def test_the_integer_kernel_leaves_empty_products_and_aliased_outs_to_torch():
    """An empty product, or an `out` that is one of the operands (the kernel would read what it
    writes), is declined: the caller's torch.matmul decides, as it would without the kernel."""
    x = torch.ones(2, 3, 4, dtype=F64)
    assert (
        products.integer_mm(x, torch.ones(4, 0, dtype=F64), out=torch.empty(2, 3, 0, dtype=F64))
        is None
    )
    assert products.integer_mm(x[:, :0], torch.ones(4, 5, dtype=F64)) is None
    square = torch.ones(6, 6, dtype=F64)
    assert products.integer_mm(square, square, out=square) is None
    array = np.ones((6, 6))  # two storages over one array's memory: still the same bytes
    one, other = torch.from_numpy(array), torch.from_numpy(array)
    assert products.integer_mm(one, one, out=other) is None
    assert (
        products.integer_mm(square[:3], square[3:].t(), out=square[3:, :3].contiguous()) is not None
    )


@needs_native
def test_the_timing_keeps_no_answer_it_could_not_measure(monkeypatch):
    """The timing runs on the CPU whatever torch's default device, and where the kernel declines
    during it (turned off meanwhile by another thread) it keeps no answer and takes torch's."""
    monkeypatch.setattr(products, "_FASTER", {})
    torch.set_default_device("meta")
    try:
        assert isinstance(products.faster_than_torch(), bool)
    finally:
        torch.set_default_device(None)  # no device context left behind
    monkeypatch.setattr(products, "_FASTER", {})
    monkeypatch.setattr(products, "integer_mm", lambda a, b, out=None: None)
    assert products.faster_than_torch() is False
    assert products._FASTER == {}
