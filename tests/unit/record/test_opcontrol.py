"""record/opcontrol: the op recorder of a chosen step and the numerics watch, with twice's own
work kept out of what they see."""

import torch

from twice.record.opcontrol import OpControl
from twice.store.oplogs import recorded_steps, step_ops


def test_only_a_chosen_step_is_recorded_and_paused_work_is_left_out(tmp_path):
    control = OpControl(tmp_path, None, record_ops={1})
    assert control.modes() == []
    with control.paused():  # nothing watches: nothing to pause
        pass
    control.start(0)
    torch.ones(2).mul(5)
    control.stop(0)
    control.start(1)
    control.set_phase("forward")
    torch.ones(2).mul(3)
    with control.paused():
        torch.ones(3).sum()  # twice's own digests and norms
    control.stop(0)  # the step recorded is not over yet
    assert control.current is not None
    control.stop(1)
    control.close()
    ops = step_ops(tmp_path, 1)
    assert [op["op"] for op in ops] == ["aten::ones", "aten::mul.Tensor"]
    assert {op["phase"] for op in ops} == {"forward"}
    assert recorded_steps(tmp_path) == [1] and control.current is None


def test_a_forked_child_writes_its_own_stream(tmp_path):
    control = OpControl(tmp_path, None, record_ops={0, 2})
    control.start(0)
    torch.ones(1).add(1)
    control.stop(0)
    control.forked("main.fork1")
    control.start(2)
    torch.ones(1).add(2)
    control.stop(2)
    control.close()
    assert recorded_steps(tmp_path) == [0] and recorded_steps(tmp_path, "main.fork1") == [2]


def test_recording_ops_leaves_the_step_trace_unchanged(tmp_path):
    from twice.record import hooks
    from twice.store.traces import read_trace

    def train(folder, record_ops):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        hooks.install(hooks.Recorder(folder, record_ops=record_ops))
        try:
            for _ in range(4):
                optimizer.zero_grad()
                model(torch.randn(5, 6)).pow(2).mean().backward()
                optimizer.step()
        finally:
            hooks.uninstall()
        return [
            {k: v for k, v in vars(r).items() if k != "time"}
            for r in read_trace(folder / "trace.jsonl")
        ]

    plain, recorded = train(tmp_path / "plain", set()), train(tmp_path / "ops", {1, 2})
    assert len(plain) == 4 and plain == recorded
    from twice.store.oplogs import recorded_steps

    assert recorded_steps(tmp_path / "ops") == [1, 2]
