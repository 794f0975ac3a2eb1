"""ops/functions: the trigonometric and hyperbolic functions built in float64 from twice's own
exp, log and sine, accurate to float64 and the same bits on any machine."""

import math

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import functions

F64 = torch.float64


def test_sine_cosine_and_arctangents_are_accurate_in_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(3000, generator=g, dtype=F64) * 100, torch.linspace(-7, 7, 501)])
    x = torch.cat([x.to(F64), torch.tensor([0.0, -0.0, math.pi, 1e5, 1e-300], dtype=F64)])
    for ours, theirs in [
        (functions.sin(x), torch.sin(x)),
        (functions.cos(x), torch.cos(x)),
        (functions.atan(x), torch.atan(x)),
        (functions.atan2(x, x.flip(0)), torch.atan2(x, x.flip(0))),
    ]:
        assert bool(((ours - theirs).abs() <= 4e-16 * (1 + theirs.abs())).all())
    assert functions.sin(torch.tensor([-0.0], dtype=F64)).signbit().item()  # -0 stays -0
    assert functions.sin(torch.tensor([math.inf], dtype=F64)).isnan().all()


def test_under_portable_mode_torch_calls_these_functions():
    x = torch.linspace(-3, 3, 50)
    with PortableMode("strict"):
        ours = torch.sin(x), torch.atan2(x, x + 1), torch.remainder(x, 0.7), x.prod()
    assert torch.equal(ours[0], functions.sin(x.double()).float())
    assert torch.allclose(ours[1], torch.atan2(x, x + 1), atol=1e-6)
    assert torch.allclose(ours[2], torch.remainder(x, 0.7), atol=1e-6)
    assert torch.allclose(ours[3], x.double().prod().float())
