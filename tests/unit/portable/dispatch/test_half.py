"""dispatch/half: float16 and bfloat16 through the float32 kernels, rounded once more."""

import pytest
import torch

from twice.portable.dispatch import half
from twice.portable.dispatch.mode import PortableMode


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_the_float32_kernels_rounded_to_its_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 70, generator=g).to(dtype), torch.randn(70, 17, generator=g).to(dtype)
    with PortableMode("strict"):
        product, total, exp = a @ b, a.sum(1), torch.exp(a)
        wide = (a.float() @ b.float(), a.float().sum(1), torch.exp(a.float()))
    assert product.dtype == dtype and total.dtype == dtype
    for ours, theirs in zip((product, total, exp), wide):
        assert torch.equal(ours, theirs.to(dtype))
    with PortableMode("strict"):
        assert a.sum(dtype=torch.float32).dtype == torch.float32  # torch's dtype rule kept


def test_a_half_precision_kernel_runs_on_float32_copies_rounded_once():
    from twice.portable.dispatch.table import KERNELS

    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, 9, generator=g).bfloat16(), torch.randn(9, 4, generator=g).bfloat16()
    mm = KERNELS["mm.default"]
    out = half.run(torch.ops.aten.mm.default, mm, (a, b), {})
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, mm(a.float(), b.float()).to(torch.bfloat16))
    x = torch.randn(6, generator=g).half()
    wide = x.float()
    written = half.run(torch.ops.aten.exp_.default, KERNELS["exp_.default"], (x,), {})
    assert written is x and x.dtype == torch.float16  # written back into the argument
    assert torch.equal(x, KERNELS["exp.default"](wide).half())
    assert half.HALF == (torch.float16, torch.bfloat16)
