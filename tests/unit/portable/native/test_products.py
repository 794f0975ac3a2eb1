"""native/products: the compiled float64 product in k's order (csrc/ordered.c) gives the torch
loop's bits (arithmetic/ordered.py) over generated shapes, layouts, values and thread counts;
what it does not take it declines."""

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

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
    """Every output element's sum in k's order, whatever the blocking, the tails, the strides,
    a broadcast batch (a batch of 3x1 against one of 2 on the other side), the values (NaN where
    the loop gives NaN, an infinity, a zero's sign) and the thread count."""
    g = gen(seed)
    a = _draw(g, (*batch, m, k), layout_a, va)
    b = _draw(g, ((2,) if batch == (3, 1) else batch) + (k, n), layout_b, vb)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = products.ordered_mm(a, b)
    finally:
        torch.set_num_threads(before)
    assert same_bits(got, ordered_loop(a, b)), (a.shape, b.shape, a.stride(), b.stride())
