"""ops/products: every form of matrix product exact then rounded once, so a linear layer has the
same bits whichever form torch picks for it."""

import torch

from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import KERNELS
from twice.portable.ops import products


def test_every_form_of_a_product_gives_the_exact_products_bits():
    assert KERNELS["mm.default"].__module__ == products.__name__
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 30, generator=g) * torch.logspace(-3, 3, 30)
    b, v = torch.randn(30, 5, generator=g), torch.randn(30, generator=g)
    bias = torch.randn(5, generator=g)
    exact = exact_matmul(a, b)
    with PortableMode("strict"):
        forms = [a @ b, torch.mm(a, b), torch.bmm(a[None], b[None])[0], torch.matmul(a, b)]
        linear = torch.nn.functional.linear(a, b.t().contiguous(), bias)
        vector = torch.mv(a, v)
        dot = torch.dot(v, v)
    assert all(torch.equal(form, exact) for form in forms)
    assert torch.equal(linear, exact + bias)  # the bias added after the product is rounded
    assert torch.equal(vector, exact_matmul(a, v[:, None])[:, 0])
    assert torch.equal(dot, exact_matmul(v[None], v[:, None])[0, 0])


def _bilinear_doors():
    """Every portable op family that multiplies two float64 operands, as (name, fn, shapes):
    the product forms, the convolutions forward and their gradients."""
    import torch.nn.functional as F

    def input_grad(fn, x_shape):  # the gradient of fn's input: bilinear in (upstream, weight)
        def run(upstream, w):
            x = torch.zeros(x_shape, dtype=w.dtype, requires_grad=True)
            return torch.autograd.grad(fn(x, w), x, upstream)[0]

        return run

    def weight_grad(fn, w_shape):  # the gradient of fn's weight: bilinear in (upstream, input)
        def run(upstream, x):
            w = torch.zeros(w_shape, dtype=x.dtype, requires_grad=True)
            return torch.autograd.grad(fn(x, w), w, upstream)[0]

        return run

    conv2 = lambda x, w: F.conv2d(x, w, padding=1)  # noqa: E731
    conv3 = lambda x, w: F.conv3d(x, w)  # noqa: E731
    return [
        ("mm", torch.mm, ((5, 7), (7, 3))),
        ("bmm", torch.bmm, ((2, 5, 7), (2, 7, 3))),
        ("matmul-transposed", lambda a, b: a @ b.t(), ((5, 7), (3, 7))),
        ("mv", torch.mv, ((5, 7), (7,))),
        ("dot", torch.dot, ((9,), (9,))),
        ("einsum", lambda a, b: torch.einsum("ij,kj->ik", a, b), ((4, 6), (5, 6))),
        ("linear", F.linear, ((4, 6), (3, 6))),
        ("conv1d", lambda x, w: F.conv1d(x, w), ((2, 3, 9), (4, 3, 3))),
        ("conv2d", conv2, ((2, 3, 6, 6), (4, 3, 3, 3))),
        ("conv2d-input-grad", input_grad(conv2, (2, 3, 6, 6)), ((2, 4, 6, 6), (4, 3, 3, 3))),
        ("conv2d-weight-grad", weight_grad(conv2, (4, 3, 3, 3)), ((2, 4, 6, 6), (2, 3, 6, 6))),
        ("conv3d-input-grad", input_grad(conv3, (1, 2, 4, 5, 4)),
         ((1, 3, 3, 3, 3), (3, 2, 2, 3, 2))),
        ("conv3d-weight-grad", weight_grad(conv3, (3, 2, 2, 3, 2)),
         ((1, 3, 3, 3, 3), (1, 2, 4, 5, 4))),
        ("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w), ((2, 3, 5, 5), (3, 2, 3, 3))),
    ]  # fmt: skip


def test_every_float64_product_door_scales_by_powers_of_two_at_any_range():
    """SCALE across the ops: each product door, its operands times 2**ka and 2**kb, gives its
    bits times 2**(ka + kb) exactly, where the units' product lies beyond the band on either
    side (the results stay normal, the operands above 2**-990, where a row's grid is its own:
    exact.unit_for), and where it overflows the double range an exact zero
    stays 0 (ordinary results are infinite), never NaN."""
    g = torch.Generator().manual_seed(4)
    for name, fn, (shape_a, shape_b) in _bilinear_doors():
        a = torch.randn(*shape_a, generator=g, dtype=torch.float64)
        b = torch.randn(*shape_b, generator=g, dtype=torch.float64)
        with PortableMode("strict"):
            base = fn(a, b)
            for ka, kb in ((480, 480), (-480, -480), (990, -60), (-960, 500), (-500, -490)):
                got = fn(a * 2.0**ka, b * 2.0**kb)
                assert torch.equal(got, base * 2.0**ka * 2.0**kb), (name, ka, kb)
            zero = fn(a * 0.0 + 2.0**540, b * 0.0 + 2.0**540)  # finite operands, inf results
            cancel = fn(a * 0.0 + 2.0**540, b * 0.0)
        assert not zero.isnan().any() and not cancel.isnan().any(), name
        assert not cancel.signbit().any() and not cancel.ne(0).any(), name
