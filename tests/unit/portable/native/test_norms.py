"""native/norms: the compiled batch and layer norm kernels, bit-equal to their torch fallbacks."""

import itertools
import math

import torch

from twice.portable import native
from twice.portable.native import norms as native_norms
from twice.portable.ops import norms
from unit.portable.bits import (
    F64,
    both,
    gen,
    needs_native,
    same_bits,
)


@needs_native
def test_batch_and_layer_norms_native_equal_fallback():
    g = gen(3)
    for dt in (torch.float32, F64):
        w, b = torch.randn(3, generator=g).to(dt), torch.randn(3, generator=g).to(dt)
        # small planes, planes longer than the C kernels' chunks and lanes, and a non-finite value
        cases = [(4, 3, 5, 6), (3, 3, 17, 19), "inf"]
        for shape, train in itertools.product(cases, (True, False)):
            x = torch.randn(shape if shape != "inf" else (2, 3, 9), generator=g).to(dt) * 3 + 1
            if shape == "inf":
                x[1, 2, 4] = math.inf
            go = torch.randn(x.shape, generator=g).to(dt)

            def batch_norm(train=train, x=x, go=go):
                rm, rv = torch.zeros(3, dtype=dt), torch.ones(3, dtype=dt)
                out, sm, si = norms.batch_norm(x, w, b, rm, rv, train, 0.1, 1e-5)
                saved = (sm, si) if train else (None, None)
                grads = norms.batch_norm_backward(
                    go, x, w, rm, rv, *saved, train, 1e-5, [True, True, True]
                )
                return torch.cat([t.reshape(-1).double() for t in (out, sm, si, rm, rv, *grads)])

            assert same_bits(*both(batch_norm)), (shape, train)
    for shape, normalized in [((6, 9, 16), [16]), ((5, 7), [7]), ((3, 4, 5, 6), [5, 6])]:
        x = torch.randn(*shape, generator=g) * 3 + 1
        go = torch.randn(*shape, generator=g)
        w, b = torch.randn(*normalized, generator=g), torch.randn(*normalized, generator=g)
        for affine in ((w, b), (None, None)):

            def layer_norm(affine=affine, x=x, go=go, normalized=normalized):
                out, mean, rstd = norms.layer_norm(x, normalized, *affine, 1e-5)
                grads = norms.layer_norm_backward(
                    go, x, normalized, mean, rstd, *affine, [True, True, True]
                )
                parts = (out, mean, rstd, *grads)
                return torch.cat([t.reshape(-1).double() for t in parts if t is not None])

            assert torch.equal(*both(layer_norm))


def test_the_kernels_decline_what_they_do_not_take():
    """None: norms.py computes it with torch operations (the same bits, held above)."""
    x = torch.randn(4, 6)
    assert native_norms.layer_norm(x.double(), 6, None, None, 1e-5, 0) is None
    assert native_norms.layer_norm(x.t(), 4, None, None, 1e-5, 0) is None
    assert native_norms.chansum(0, torch.ones(3), None, None, None, None, 0, 3) is None
    with native.fallback():
        assert native_norms.layer_norm(x, 6, None, None, 1e-5, 0) is None
