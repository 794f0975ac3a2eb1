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
