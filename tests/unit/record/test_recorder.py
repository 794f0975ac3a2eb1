"""record: the recorder's step records on real optimizers in this process (hooks installed for
real)."""

import torch

from twice.core.digests import digest, digest_pairs
from twice.record import hooks
from twice.record.recorder import Recorder
from twice.store.traces import read_trace


def _params_digest(model):
    return digest_pairs([(name, digest(p)) for name, p in model.named_parameters()])


def test_models_trained_one_after_another_are_recorded_with_their_own_parameters(tmp_path):
    """A new model and optimizer per fold, in one process: an optimizer built where a freed one
    lived must not be recorded with the freed one's parameters (its id is the same)."""
    recorder = hooks.install(Recorder(tmp_path, params_every=1))
    expected = []
    try:
        for _fold in range(4):
            model = torch.nn.Linear(3, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(5, 3)).sum().backward()
                optimizer.step()
                expected.append(_params_digest(model))
            del model, optimizer
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == list(range(12)) and recorder.step_index == 12
    assert [r.params for r in records] == expected


def test_a_gan_round_of_two_optimizers_is_one_step(tmp_path):
    torch.manual_seed(0)
    g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    hooks.install(Recorder(tmp_path))
    try:
        for _ in range(4):
            for opt in (opt_d, opt_g):
                opt.zero_grad()
                d(g(torch.randn(3, 2))).sum().backward()
                opt.step()
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3]
