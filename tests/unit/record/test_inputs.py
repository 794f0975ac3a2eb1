"""record/inputs: the batch of a loop without a DataLoader is the data given to each step's
outermost module calls, never a tensor the step computed."""

import torch

from twice.core.digests import Digester
from twice.record.inputs import ModuleInputs


def _batch_of(calls) -> str | None:
    """The digest ModuleInputs takes from `calls`: (depth change, args) pairs."""
    inputs = ModuleInputs()
    for change, args in calls:
        if change > 0:
            inputs.enter(args, {}, torch.Tensor)
        else:
            inputs.leave()
    taken, quiet = inputs.take()
    assert quiet is None and inputs.take() == (None, None)  # a take starts afresh
    return taken.hexdigest() if taken is not None else None


def test_only_the_outermost_calls_data_is_the_batch():
    x, y = torch.arange(6.0).reshape(2, 3), torch.tensor([0, 1])
    out = torch.ones(2, 3, requires_grad=True) * 2  # made by the graph: not data
    inner = torch.full((2, 3), 9.0)
    batch = _batch_of([(1, (x,)), (1, (inner,)), (-1, ()), (-1, ()), (1, (out, y)), (-1, ())])
    assert batch == Digester(strict=False).update([x]).update([y]).hexdigest()
    assert batch != _batch_of([(1, (x,)), (-1, ()), (1, (out, y + 1)), (-1, ())])


def test_a_call_with_no_data_gives_no_batch():
    weights = torch.nn.Parameter(torch.ones(2))
    assert _batch_of([(1, (weights, 3, "text")), (-1, ())]) is None
    assert _batch_of([(1, ([torch.ones(1), weights],)), (-1, ())]) is None  # a list: all data
    assert _batch_of([(1, (torch.empty(2, device="meta"),)), (-1, ())]) is None
    assert _batch_of([(1, ((torch.ones(1), torch.zeros(1)),)), (-1, ())]) is not None


def test_leaving_more_calls_than_entered_does_not_go_below_zero():
    inputs = ModuleInputs()
    inputs.leave()
    assert inputs.depth == 0
    inputs.enter((torch.ones(1),), {}, torch.Tensor)
    assert inputs.depth == 1 and inputs.take()[0] is not None


def test_a_sealed_take_leaves_the_calls_entered_since_for_the_next_step():
    """A hand loop's step ends inside the next step's first module call: a sealed take gives
    the calls before the step's backward (`seal`) and keeps the new call's for the next step."""
    first, second = torch.ones(2), torch.zeros(2)
    inputs = ModuleInputs()
    inputs.enter((first,), {}, torch.Tensor)
    inputs.leave()
    inputs.seal()  # the step's backward ended
    inputs.enter((second,), {}, torch.Tensor)  # the next step's forward, not yet left
    taken, _ = inputs.take(sealed=True)
    assert taken.hexdigest() == Digester(strict=False).update([first]).hexdigest()
    inputs.leave()
    assert inputs.take()[0].hexdigest() == Digester(strict=False).update([second]).hexdigest()
    assert inputs.take(sealed=True) == (None, None)


def test_calls_without_gradients_are_kept_apart_from_the_training_calls():
    """An evaluation forward (gradients off) between training calls: its data is digested apart,
    so the training calls' digest is the same with or without it, and the two sides seal and
    take alike."""
    train, val = torch.ones(2), torch.full((2,), 5.0)
    inputs = ModuleInputs()
    for args, quiet in (((train,), False), ((val,), True)):
        inputs.enter(args, {}, torch.Tensor, quiet=quiet)
        inputs.leave()
    inputs.seal()
    inputs.enter((val + 1,), {}, torch.Tensor, quiet=True)  # after the backward: the next step's
    trained, quiet = inputs.take(sealed=True)
    assert trained.hexdigest() == Digester(strict=False).update([train]).hexdigest()
    assert quiet.hexdigest() == Digester(strict=False).update([val]).hexdigest()
    inputs.leave()
    trained, quiet = inputs.take()
    assert trained is None
    assert quiet.hexdigest() == Digester(strict=False).update([val + 1]).hexdigest()
