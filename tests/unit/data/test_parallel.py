"""InvariantDataParallel on one process: the global batch's gradient as the fixed pairwise tree
of its micro-batches' gradients, each micro-batch under its own RNG stream."""

import pytest
import torch

from twice.data.parallel import InvariantDataParallel


def _loss(net, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(net(x), y)


def _batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)


def test_the_gradient_is_the_pairwise_tree_of_the_micro_batch_gradients_bit_for_bit():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    x, y = _batch()
    slices = []
    for i in range(4):
        net.zero_grad()
        _loss(net, (x[2 * i : 2 * i + 2], y[2 * i : 2 * i + 2])).backward()
        slices.append(torch.cat([net.weight.grad.reshape(-1), net.bias.grad.reshape(-1)]))
    by_hand = ((slices[0] + slices[1]) + (slices[2] + slices[3])) / 4
    loss = InvariantDataParallel(net, micro_batches=4, seed=0).backward((x, y), _loss)
    assert torch.equal(torch.cat([net.weight.grad.reshape(-1), net.bias.grad.reshape(-1)]), by_hand)
    assert loss.shape == ()


def test_each_micro_batch_draws_from_its_own_stream_whatever_the_global_rng():
    def grads(global_seed):
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(3, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)
        )
        model = InvariantDataParallel(net, micro_batches=4, seed=7)
        torch.manual_seed(global_seed)
        model.backward(_batch(), _loss)
        model.backward(_batch(), _loss)  # the second step draws other masks than the first
        return [p.grad.clone() for p in net.parameters()], model.state_dict()["steps"]

    first, steps = grads(1)
    second, _ = grads(2)
    assert steps == 2 and all(torch.equal(a, b) for a, b in zip(first, second))


def test_the_wrapper_forwards_calls_and_restores_its_step_count():
    net = torch.nn.Linear(3, 1)
    model = InvariantDataParallel(net, micro_batches=2, seed=0)
    x = torch.ones(2, 3)
    assert torch.equal(model(x), net(x))
    model.load_state_dict({"module": net.state_dict(), "steps": 5})
    assert model.state_dict()["steps"] == 5
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="parameters of one dtype"):
        InvariantDataParallel(mixed, micro_batches=2)
