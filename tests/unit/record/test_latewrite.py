"""record/latewrite: a step's digests, norms and loss read back a step late on an accelerator,
and nothing of it on the CPU."""

import torch

from twice.core.fastpath import lanes_norm
from twice.record.latewrite import LateWriter
from twice.record.norms import norms
from twice.record.openstep import StepRound


def test_on_the_cpu_the_late_path_takes_nothing_and_the_step_is_written_now():
    writer = LateWriter()
    tensors = [torch.ones(3), torch.arange(4.0)]
    assert writer.digests(tensors, True, lanes_norm, norms) is None
    round_ = StepRound(losses=[torch.tensor(1.5)], grad_squares=[2.0])
    assert writer.start(round_) is False and round_.late is None
    assert writer.forked().devices == writer.devices


def test_the_sigterm_handler_is_installed_once(monkeypatch):
    """Even where the handler before it was set outside Python (getsignal says None), the late
    writer installs its own once, not once a step, each wrapping the last."""
    from twice.record import latewrite

    installed = []
    monkeypatch.setattr(latewrite.signal, "getsignal", lambda signum: None)
    monkeypatch.setattr(latewrite.signal, "signal", lambda _, handler: installed.append(handler))
    writer = latewrite.LateWriter()
    for _ in range(3):  # three late steps
        writer._watch_kill()
    assert len(installed) == 1 and callable(installed[0])
