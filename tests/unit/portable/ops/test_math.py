"""ops/math: reductions and elementwise arithmetic, the optimizers' in place, bit-equal
compiled or not."""

import torch

from twice.portable.ops import math as om
from unit.portable.bits import (
    F64,
    both,
    gen,
    needs_native,
)


@needs_native
def test_the_optimizers_arithmetic_native_equals_fallback():
    g = gen(3)
    for dt in (torch.float32, F64):
        s, t1, t2 = (torch.randn(1000, generator=g).to(dt) for _ in range(3))
        for fn in (
            lambda: om._addcmul(s, t1, t2, value=-0.37),
            lambda: om._addcdiv(s, t1, t2, value=0.1),
            lambda: om._lerp(s, t1, 0.1),
            lambda: om._lerp(s, t1, 0.9),
            lambda: om._add(s, t1, alpha=-0.001),
            lambda: om._addcmul_(s.clone(), t1, t2, value=-0.37),  # the in-place kernels
            lambda: om._addcdiv_(s.clone(), t1, t2, value=0.1),
            lambda: om._lerp_(s.clone(), t1, 0.9),
            lambda: om._add_(s.clone(), t1, alpha=-0.001),
        ):
            assert torch.equal(*both(fn))
