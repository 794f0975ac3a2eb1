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


def _dtype_cases():
    """Calls of one overload whose outputs' dtypes differ only by what the signature holds:
    operand dtypes, a dtype argument, 0-dimensional tensors against wrapped Python numbers."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(4, 3, generator=g).bfloat16()
    f16 = torch.randn(4, 3, generator=g).half()
    f32, f64 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g).double()
    z, z64 = h[0, 0].clone(), torch.tensor(2.0, dtype=torch.float64)
    return [
        lambda: h + h, lambda: h + f32, lambda: h + f64, lambda: f16 + h, lambda: h + 2.0,
        lambda: h + 2, lambda: h.sum(1), lambda: h.sum(1, dtype=torch.float32),
        lambda: h.sum(1, dtype=torch.float64), lambda: h.sum(1), lambda: z + z64,
        lambda: z + 2.0, lambda: z * 3, lambda: h * z64, lambda: torch.cat([h, h]),
        lambda: torch.cat([h, f32]), lambda: h.to(torch.float32), lambda: h.mean(0),
        lambda: torch.ops.aten._softmax.default(h, 1, False), lambda: torch.softmax(h, 1),
    ]  # fmt: skip


def test_the_outputs_dtypes_are_torchs_in_every_order_of_calls():
    """The dtypes kept per signature never answer a call whose signature differs: every call,
    in three orders (each twice, so the second meets the first one's kept answer), gives
    torch's dtype and value rounded from the float32 kernel's."""
    cases = _dtype_cases()
    expected = [case().dtype for case in cases]
    for order in (range(len(cases)), reversed(range(len(cases))), [0, 10, 11, 6, 8, 7, 2, 1]):
        order = list(order) * 2
        half._CACHE.clear()
        with PortableMode("strict"):
            got = [(i, cases[i]().dtype) for i in order]
        assert got == [(i, expected[i]) for i in order]


def test_a_flag_and_a_failed_call_do_not_answer_another_call():
    """A flag that chooses the dtype (`_softmax`'s half_to_float) is part of the signature, and
    a call that failed (a dimension out of range) leaves no answer for the next."""
    h = torch.randn(4, 3).bfloat16()
    half._CACHE.clear()
    with PortableMode("strict"):
        assert torch.ops.aten._softmax.default(h, 1, True).dtype == torch.float32
        assert torch.softmax(h, 1).dtype == torch.bfloat16
        with pytest.raises(IndexError):
            h.sum(5, dtype=torch.float32)
        assert h.sum(1, dtype=torch.float32).dtype == torch.float32


def test_a_signature_is_asked_of_torch_once(monkeypatch):
    asked = []
    meta = half._meta_dtypes
    monkeypatch.setattr(half, "_meta_dtypes", lambda *a: asked.append(a[0]) or meta(*a))
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, 5, generator=g).bfloat16(), torch.randn(5, 7, generator=g).bfloat16()
    half._CACHE.clear()
    with PortableMode("strict"):
        a @ b, a + 1
        first = list(asked)
        (a + 1) @ b, (a + 2) @ b
        assert asked == first  # the same signatures: nothing asked again
        a @ b.float()  # mixed operands: another signature
        assert len(asked) == len(first) + 1
        a[0, 0] + 1, a[0, 0] + 1  # 0-dimensional: asked every time
        assert len(asked) == len(first) + 3
