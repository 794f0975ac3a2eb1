"""ops/random: every random operation draws one 64-bit key from torch's generator and its
values from Philox, with the moments of its distribution."""

import math

import pytest
import torch
from torch import nn

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import random as prandom

RANDOM = {
    "rand_like": lambda x: torch.rand_like(x),
    "randn_like": lambda x: torch.randn_like(x),
    "randint_like": lambda x: torch.randint_like(x, 0, 7),
    "uniform_": lambda x: x.clone().uniform_(-1, 2),
    "normal_": lambda x: x.clone().normal_(1, 2),
    "exponential_": lambda x: x.clone().exponential_(2.0),
    "geometric_": lambda x: x.clone().geometric_(0.3),
    "cauchy_": lambda x: x.clone().cauchy_(0.0, 1.0),
    "log_normal_": lambda x: x.clone().log_normal_(0.0, 0.5),
    "bernoulli_": lambda x: x.clone().bernoulli_(0.3),
    "bernoulli": lambda x: torch.bernoulli(torch.full_like(x, 0.3)),
    "multinomial": lambda x: torch.multinomial(x.abs().reshape(-1)[:50] + 0.1, 20),
    "multinomial_replacement": lambda x: torch.multinomial(x.abs()[:4] + 0.1, 30, True),
    "normal_tensors": lambda x: torch.normal(x, torch.ones_like(x)),
    "rrelu": lambda x: nn.functional.rrelu(x, training=True),
    "alpha_dropout": lambda x: nn.functional.alpha_dropout(x, 0.3, True),
    "feature_alpha_dropout": lambda x: nn.functional.feature_alpha_dropout(x, 0.3, True),
    "dropout": lambda x: nn.functional.dropout(x, 0.3, True),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_every_random_op_draws_one_key_and_its_values_from_philox(name):
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    call = RANDOM[name]
    torch.manual_seed(0)
    with PortableMode("strict"):
        first = call(x)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    with PortableMode("strict"):
        again = call(x)
    assert torch.equal(first, again)  # a function of the seed alone
    torch.manual_seed(0)
    plain = call(x)
    assert not torch.equal(first, plain)  # not torch's stream
    torch.manual_seed(0)
    keys = 0
    while keys < 4 and not torch.equal(torch.get_rng_state(), after):
        torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)  # one Philox key
        keys += 1
    assert torch.equal(torch.get_rng_state(), after) and keys >= 1  # keys only, not a stream


def test_the_distributions_have_their_moments():
    torch.manual_seed(0)
    x = torch.empty(200_000, dtype=torch.float64)
    with PortableMode("strict"):
        exponential = x.clone().exponential_(2.0)
        geometric = x.clone().geometric_(0.25)
        log_normal = x.clone().log_normal_(0.0, 0.5)
        cauchy = x.clone().cauchy_(1.0, 2.0)
        drawn = torch.multinomial(torch.tensor([0.1, 0.2, 0.7]), 100_000, True)
    assert abs(float(exponential.mean()) - 0.5) < 0.01
    assert abs(float(geometric.mean()) - 4.0) < 0.05 and float(geometric.min()) == 1.0
    assert abs(float(log_normal.mean()) - math.exp(0.125)) < 0.01
    assert abs(float(cauchy.median()) - 1.0) < 0.05
    share = torch.bincount(drawn, minlength=3).double() / drawn.numel()
    assert torch.allclose(share, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=0.01)


def test_a_generator_passed_keys_the_draw_and_the_default_one_is_left_alone():
    from twice.portable.dispatch.table import KERNELS

    for name in ("uniform_.default", "normal_.default", "randperm.default"):
        assert KERNELS[name].__module__ == prandom.__name__, name
    x = torch.empty(1000)
    with PortableMode("strict"):
        first = x.clone().uniform_(generator=torch.Generator().manual_seed(3))
        state = torch.get_rng_state()
        again = x.clone().uniform_(generator=torch.Generator().manual_seed(3))
        assert torch.equal(torch.get_rng_state(), state)  # the default generator did not move
    assert torch.equal(first, again) and 0.0 <= float(first.min()) and float(first.max()) < 1.0
