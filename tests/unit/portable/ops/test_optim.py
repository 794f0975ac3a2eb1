"""ops/optim: the fused optimizers give their unfused bits, and every torch optimizer runs
under portable mode in each of its forms."""

import contextlib

import pytest
import torch
from torch import nn

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import optim


@pytest.mark.parametrize(
    "make",
    [
        lambda p, fused: torch.optim.Adam(p, lr=1e-2, fused=fused),
        lambda p, fused: torch.optim.Adam(
            p, lr=1e-2, weight_decay=0.01, amsgrad=True, maximize=True, fused=fused
        ),
        lambda p, fused: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=fused),
        lambda p, fused: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=1e-3, fused=fused),
        lambda p, fused: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, fused=fused),
    ],
)
def test_fused_optimizers_give_their_unfused_bits(make):
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    data = [(torch.randn(4, 6), torch.randn(4, 2)) for _ in range(4)]
    finals = []
    for fused in (False, True):
        net = copy.deepcopy(model)
        opt = make(net.parameters(), fused)
        mode = PortableMode("strict")
        with mode:
            for x, y in data:
                loss = ((net(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    assert torch.equal(*finals)


def _optimizers():
    import inspect

    for name in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        if name in ("Optimizer", "LBFGS", "SparseAdam"):  # a closure; sparse gradients
            continue
        params = inspect.signature(cls).parameters
        yield name, cls, [v for v in ("foreach", "fused") if v in params]


@pytest.mark.parametrize("name", [n for n, _, _ in _optimizers()])
def test_every_optimizer_and_its_foreach_and_fused_forms_run_portable(name):
    cls, variants = next((c, v) for n, c, v in _optimizers() if n == name)
    finals = {}
    for variant in ["single", *variants]:
        torch.manual_seed(0)
        model = nn.Linear(4, 4, bias=False)  # 2-d: every optimizer (Muon) takes it
        options = {"foreach": False} if variant == "single" and variants else {}
        options.update({variant: True} if variant != "single" else {})
        opt = cls(model.parameters(), lr=0.01, **options)
        with PortableMode("strict"):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(5, 4)).square().sum().backward()
                opt.step()
        finals[variant] = model.weight.detach().clone()
    same = {v: torch.equal(finals[v], finals["single"]) for v in variants}
    # torch's own foreach ASGD, NAdam and RAdam spell their arithmetic in another order than
    # their single-tensor forms (they differ without portable mode too): each is portable,
    # not equal to the other
    if name not in ("ASGD", "NAdam", "RAdam"):
        assert all(same.values()), same  # the fused and foreach kernels give the single bits


def test_fused_adagrad_gives_its_unfused_bits_through_this_modules_kernel():
    from twice.portable.dispatch.table import KERNELS

    assert KERNELS["_fused_adagrad_.default"].__module__ == optim.__name__
    finals = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.1, weight_decay=0.01, fused=fused)
        with PortableMode("strict"):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(4, 5)).square().sum().backward()
                opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(*finals)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_a_fused_step_moves_the_version_counters_as_torchs_fused_kernel(cls):
    """Torch's fused kernel moves no version counter (a graph that saved a parameter still runs
    backward after the step); the mode's step, in one compiled pass or operation by operation,
    leaves each tensor's version where torch's leaves it, so a program runs as it does without
    the mode."""
    versions = []
    for portable in (False, True):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(5, 3))
        opt = cls([p], lr=1e-2, weight_decay=0.1, fused=True)
        (p * p).sum().backward()
        opt.step()  # the state exists now
        y = (p * p).sum()
        with PortableMode("strict") if portable else contextlib.nullcontext():
            opt.step()
        state = opt.state[p]
        versions.append((p._version, state["exp_avg"]._version, state["exp_avg_sq"]._version))
        y.backward()  # raises where a counter moved
    assert versions[0] == versions[1]
