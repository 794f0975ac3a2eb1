"""record/rounds: an optimizer loop's steps; a round of several optimizers is one step, an
optimizer stepping inside another is part of its step, a closure's gradients are its own."""

import math

import torch

import twice
from twice.core.fastpath import lanes_norm
from twice.record import hooks
from twice.record.recorder import Recorder
from twice.record.rounds import OptimizerRounds
from twice.store.traces import read_trace
from unit.record.loops import train


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


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al. 2019) as commonly written: a torch optimizer whose step() runs its
    base optimizer's step() and every k steps pulls slow weights towards the fast ones."""

    def __init__(self, base, k=2, alpha=0.5):
        self.base, self.k, self.alpha, self.count = base, k, alpha, 0
        super().__init__(base.param_groups, {})
        self.slow = [p.detach().clone() for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        self.base.step()
        self.count += 1
        if self.count % self.k == 0:
            for slow, fast in zip(
                self.slow, (p for group in self.param_groups for p in group["params"])
            ):
                slow.add_(fast - slow, alpha=self.alpha)
                fast.copy_(slow)


def lookahead_model():
    model = torch.nn.Linear(4, 3)
    return (
        [model],
        [Lookahead(torch.optim.SGD(model.parameters(), lr=0.1))],
        lambda step: model(torch.randn(8, 4)).pow(2).mean(),
    )


def test_an_optimizer_stepping_inside_another_is_part_of_its_step(tmp_path):
    """Lookahead's base optimizer steps inside Lookahead's step: one record per step, each gradient
    once, the norm the gradients' own, and the parameters those after Lookahead's pull."""
    records = train(tmp_path, lookahead_model, steps=4)
    assert [r.step for r in records] == [0, 1, 2, 3]
    torch.manual_seed(0)
    (model,), (optimizer,), loss_of = lookahead_model()
    for step, record in enumerate(records):
        optimizer.zero_grad()
        loss_of(step).backward()
        norms = [lanes_norm(p.grad) for p in (model.weight, model.bias)]
        assert record.grad_norm == math.sqrt(sum(n * n for n in norms)).hex()  # the two, once each
        assert record.grad_digests == {
            "weight": twice.digest(model.weight.grad),
            "bias": twice.digest(model.bias.grad),
        }
        optimizer.step()
        assert record.param_digests == {
            "weight": twice.digest(model.weight),
            "bias": twice.digest(model.bias),
        }


def test_a_closure_steps_gradients_are_the_ones_it_computed(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=2)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    grads = []

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    recorder = hooks.install(Recorder(tmp_path, params_every=1))
    assert isinstance(recorder.rounds, OptimizerRounds)
    try:
        for _ in range(2):
            optimizer.step(closure)
            grads.append(
                {"weight": twice.digest(model.weight.grad), "bias": twice.digest(model.bias.grad)}
            )
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == [0, 1]
    assert [r.grad_digests for r in records] == grads  # the closure's last gradients
