"""The log-domain kernels: logcumsumexp adds in index order, element by element, in float64."""

import math

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import logs


def test_logcumsumexp_is_the_running_logaddexp_rounded_once():
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with PortableMode("strict"):
        ours = torch.logcumsumexp(x, 1)
        ours.sum().backward()
    reference = torch.logcumsumexp(x.detach().double(), 1)
    assert bool(((ours.double() - reference).abs() <= 1e-6 * reference.abs() + 1e-7).all())
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    rows = torch.stack([logs._logcumsumexp(x.detach()[i], 0) for i in range(6)])
    assert torch.equal(rows, logs._logcumsumexp(x.detach(), 1))  # a row's bits are its own


def test_logcumsumexp_keeps_far_apart_and_infinite_terms():
    x = torch.tensor([-1000.0, 0.0, -math.inf, 3.0])
    out = logs._logcumsumexp(x, 0)
    assert out[0] == -1000.0 and out[1] == 0.0 and out[2] == 0.0
    assert logs._logcumsumexp(torch.tensor([-math.inf, -math.inf]), 0).tolist() == [-math.inf] * 2
    assert logs._logcumsumexp(torch.empty(0), 0).numel() == 0
