"""Named RNG streams: randomness for one purpose that other purposes cannot shift."""

import random

import numpy as np
import pytest
import torch

import twice
from twice.core.seeds import derive_seed
from twice.rng.streams import stream


def train(lr, evaluate):
    """Initial weights and batches drawn from named streams; an optional eval pass draws random
    numbers."""
    torch.manual_seed(123)
    twice.stream.reset()  # each call stands for a separate run
    with twice.stream("init", seed=0):
        model = torch.nn.Linear(3, 2)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = []
    for step in range(4):  # noqa: B007
        with twice.stream("data", seed=0):
            batch = torch.randn(5, 3)
            batch = batch + random.random() + float(np.random.rand())
        batches.append(batch)
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()
        if evaluate:
            torch.rand(100)  # an evaluation pass with dropout-like randomness on the global RNG
            random.random()
    return initial, batches


def test_streams_keep_batches_and_initial_weights_bit_identical_when_lr_or_evaluation_change():
    base_init, base_batches = train(0.1, evaluate=False)
    for lr, evaluate in ((0.1, True), (0.5, False), (0.5, True)):
        init, batches = train(lr, evaluate)
        assert all(torch.equal(base_init[k], init[k]) for k in base_init)
        assert all(torch.equal(a, b) for a, b in zip(base_batches, batches))


def test_a_stream_continues_where_it_left_off_and_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    with twice.stream("s1", seed=99):
        first = torch.rand(3)
    with twice.stream("s1", seed=99):
        second = torch.rand(3)
    assert torch.equal(torch.rand(2), expected)
    assert not torch.equal(first, second)
    gen = twice.stream("s1", seed=99).generator()
    assert torch.equal(
        torch.rand(3, generator=gen),
        torch.rand(3, generator=twice.stream("s1", seed=99).generator()),
    )


def test_a_streams_generators_are_seeded_from_its_name_and_root_seed():
    named = stream("data", seed=5)
    assert named.seed == derive_seed(5, "stream", "data") != stream("init", seed=5).seed
    assert torch.equal(
        torch.rand(4, generator=named.generator()),
        torch.rand(4, generator=torch.Generator().manual_seed(named.seed)),
    )
    assert named.numpy_generator().random() == np.random.default_rng(named.seed).random()
    with pytest.raises(ValueError, match="non-empty name"):
        stream("")
