"""record/handsteps: where a step of a loop that updates its parameters by hand ends, read from
the counters torch keeps (versions, gradient identity), never from the tensors."""

import torch

from twice.record.handsteps import HandSteps, graph_leaves


def test_a_graphs_leaves_are_found_once_each_in_the_same_order_every_time():
    torch.manual_seed(0)
    w, b = torch.randn(3, 2, requires_grad=True), torch.randn(2, requires_grad=True)
    x = torch.randn(4, 3)
    h = x @ w
    loss = ((h + b) * h).sum()  # w reached twice
    leaves = graph_leaves(loss)
    assert len(leaves) == 2 and {id(t) for t in leaves} == {id(w), id(b)}
    again = graph_leaves(((x @ w + b) * (x @ w)).sum())
    assert [id(t) for t in again] == [id(t) for t in leaves]
    assert [id(t) for t in graph_leaves([b.sum(), loss])][0] == id(b)  # roots in order
    assert graph_leaves(x.sum()) == []  # nothing requires a gradient


def _backward(steps: HandSteps, w: torch.Tensor) -> None:
    loss = (w * w).sum()
    steps.backward_starts(loss)
    loss.backward()
    steps.backward_ended(losses=1, batches=0)


def test_an_update_in_place_or_a_gradient_reset_ends_the_step_and_data_updates_do_not_show():
    w = torch.ones(3, requires_grad=True)
    steps = HandSteps()
    assert not steps.updated() and steps.params == []
    _backward(steps, w)
    assert steps.params == [w] and steps.open and not steps.updated()
    with torch.no_grad():
        w -= 0.1 * w.grad  # the tutorial update
    assert steps.updated()
    steps.close()
    assert not steps.updated()
    _backward(steps, w)
    w.grad = None  # zero_grad(set_to_none=True)
    assert steps.updated()
    steps.close()
    _backward(steps, w)
    w.data.add_(w.grad, alpha=-0.1)  # through .data: no counter moves
    assert not steps.updated()
    w.grad.zero_()  # the gradient's own version does
    assert steps.updated()


def test_gradient_accumulation_keeps_one_step_open():
    w = torch.ones(2, requires_grad=True)
    steps = HandSteps()
    _backward(steps, w)
    holder = steps.leaves
    _backward(steps, w)  # a second backward before any update: the same step
    assert steps.leaves is holder and steps.params == [w]


def test_the_forward_check_runs_at_the_next_module_call_until_unwatched():
    calls = []
    steps = HandSteps()
    steps.watch_forward(lambda: calls.append(1))
    layer = torch.nn.Linear(2, 1)
    layer(torch.ones(1, 2))
    steps.unwatch()
    layer(torch.ones(1, 2))
    assert calls == [1]
