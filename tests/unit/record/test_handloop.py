"""record/handloop: the steps of a loop that updates its parameters by hand, each ending once its
tensors were updated, gradient accumulation one step."""

import torch

from twice.core.digests import digest
from twice.record import handloop, hooks
from twice.record.recorder import Recorder
from twice.store.traces import read_trace


def _hand_loop(tmp_path, updates, backwards_per_update=1, through_data=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    recorder = hooks.install(Recorder(tmp_path, params_every=1))
    after = []
    try:
        for _ in range(updates):
            for _ in range(backwards_per_update):
                model(torch.randn(4, 3)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    if through_data:
                        p.data.add_(p.grad, alpha=-0.1)
                        p.grad.data.zero_()
                    else:
                        p -= 0.1 * p.grad
                        p.grad = None
            after.append({name: digest(p) for name, p in model.named_parameters()})
    finally:
        hooks.uninstall()
    return recorder, read_trace(tmp_path / "trace.jsonl"), after


def test_each_hand_update_ends_a_step_recorded_with_the_updated_parameters(tmp_path):
    recorder, records, after = _hand_loop(tmp_path, 3)
    assert isinstance(recorder._hand, handloop.HandLoopWatch)  # no optimizer: the watch is on
    assert [r.step for r in records] == [0, 1, 2]
    assert [r.param_digests for r in records] == after
    assert all(r.loss and r.grads for r in records)


def test_gradients_accumulated_over_backward_calls_are_one_step(tmp_path):
    _, records, after = _hand_loop(tmp_path, 2, backwards_per_update=3)
    assert [r.step for r in records] == [0, 1]
    assert [len(r.loss) for r in records] == [3, 3]  # every backward's loss, in its step
    assert [r.param_digests for r in records] == after


def test_updates_through_data_are_seen_by_the_gradients_they_zero(tmp_path):
    _, records, after = _hand_loop(tmp_path, 3, through_data=True)
    assert [r.step for r in records] == [0, 1, 2]
    assert [r.param_digests for r in records] == after
