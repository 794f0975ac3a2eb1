"""native/optim: single-tensor Adam and AdamW in one compiled pass per parameter give, under
portable mode, the bits of torch's loop run one operation at a time through the mode."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.dispatch.mode import PortableMode
from twice.portable.native import optim as native_optim
from unit.portable.bits import EXAMPLES, gen, needs_native, same_bits

SPECIALS = [0.0, -0.0, 1e-45, -1e-40, 3e38, -3e38, 1e-20, math.inf, -math.inf, math.nan, 1.0]

CASES = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "adamw": st.booleans(),
        "lr": st.sampled_from([1e-3, 0.1, 1.0, 3e-7]),
        "beta1": st.sampled_from([0.9, 0.0, 0.5, 0.75, 0.999]),
        "beta2": st.sampled_from([0.999, 0.0, 0.9, 0.5]),
        "eps": st.sampled_from([1e-8, 0.0, 1e-3]),
        "weight_decay": st.sampled_from([0.0, 0.01, 1.0, 0.3]),
        "maximize": st.booleans(),
        "hostile": st.booleans(),  # infinities, NaNs, subnormals, huge values, signed zeros
        "steps": st.integers(1, 3),
        "seed": st.integers(0, 2**16),
    }
)


def _train(case, fast: bool):
    g = gen(case["seed"])
    dtype = case["dtype"]
    shapes = [(33, 7), (5,), (1,), (0, 3), (64, 9)]  # odd sizes: vector tails
    params = [torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype)) for s in shapes]
    grads = []
    for _ in range(case["steps"]):
        step = [torch.randn(s, generator=g, dtype=dtype) * 3 for s in shapes]
        if case["hostile"]:
            for t in step:
                flat = t.view(-1)
                picks = torch.randint(0, len(SPECIALS), (flat.numel(),), generator=g)
                mask = torch.rand(flat.numel(), generator=g) < 0.3
                specials = torch.tensor(SPECIALS, dtype=dtype)[picks]
                flat.copy_(torch.where(mask, specials, flat))
        grads.append(step)
    kind = torch.optim.AdamW if case["adamw"] else torch.optim.Adam
    options = {k: case[k] for k in ("lr", "eps", "weight_decay", "maximize")}
    opt = kind(params, betas=(case["beta1"], case["beta2"]), **options)
    taken = []
    with pytest.MonkeyPatch.context() as patch:
        whole = native_optim.adam
        patch.setattr(native_optim, "adam", lambda *a, **k: taken.append(1) or whole(*a, **k))
        with PortableMode("strict"):
            with native.fallback() if not fast else _nothing():
                for step in grads:
                    for p, grad in zip(params, step):
                        p.grad = grad.clone()
                    opt.step()
    assert bool(taken) == (fast and not case["maximize"])  # maximize: torch's loop, always
    state = [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq", "step")]
    versions = [t._version for p in params for t in (p, opt.state[p]["exp_avg"])]
    versions += [opt.state[p]["exp_avg_sq"]._version for p in params]
    return [p.detach() for p in params] + state, versions


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers: NaNs' signs and payloads included."""
    return t.detach().contiguous().view(torch.int64 if t.element_size() == 8 else torch.int32)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@needs_native
@EXAMPLES
@given(case=CASES)
def test_one_pass_gives_the_operation_by_operation_bits(case):
    (fast, fast_versions), (slow, slow_versions) = _train(case, True), _train(case, False)
    for a, b in zip(fast, slow, strict=True):
        # every bit but a NaN's sign and payload, which portable mode does not make canonical
        # (docs/portable.md): where two NaNs meet, the compiler's order of operands picks one
        assert same_bits(a, b)
    assert fast_versions == slow_versions  # the in-place updates autograd counts


@needs_native
def test_a_parameter_the_pass_cannot_take_goes_through_torchs_loop():
    """A non-contiguous gradient and a state sharing memory: those parameters take torch's
    operations, the others the pass, in one step; the bits are the loop's for all."""
    torch.manual_seed(0)
    base = torch.randn(8, 6)
    params = [torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(4))]

    def run(fast: bool):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.Adam(ps, lr=0.1)
        with PortableMode("strict"), _nothing() if fast else native.fallback():
            for _ in range(2):
                ps[0].grad = base.t()  # a transposed view: not contiguous
                ps[1].grad = torch.arange(4.0)
                opt.step()
        return [p.detach() for p in ps]

    assert not native_optim.applies(params[0], base.t(), torch.zeros(6, 8), torch.zeros(6, 8))
    shared = torch.zeros(6, 8)
    assert not native_optim.applies(params[0], torch.ones(6, 8), shared, shared)
    for a, b in zip(run(True), run(False), strict=True):
        assert same_bits(a, b)


def test_options_the_pass_does_not_cover_run_torchs_loop():
    """amsgrad, a tensor learning rate, a tensor beta: torch's loop, through the mode (no
    compiled pass is called)."""
    called = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_optim, "adam", lambda *a, **k: called.append(1))
        for options in (
            {"amsgrad": True},
            {"lr": torch.tensor(0.01)},
            {"betas": (torch.tensor(0.9), torch.tensor(0.99))},
        ):
            p = torch.nn.Parameter(torch.randn(5))
            opt = torch.optim.Adam([p], **options)
            with PortableMode("strict"):
                p.grad = torch.randn(5)
                opt.step()
    assert not called


def _step_under(mode_factory, fast: bool):
    """One Adam step on a fixed parameter under PortableMode and `mode_factory()` above it."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(7, 5))
    opt = torch.optim.Adam([p], lr=0.1, weight_decay=0.01)
    p.grad = torch.randn(7, 5)
    with PortableMode("strict"), _nothing() if fast else native.fallback():
        with mode_factory() as seen:
            opt.step()
    return p.detach().clone(), seen


@needs_native
def test_another_dispatch_mode_sees_every_operation_of_the_step():
    """Under twice's op recorder, its numerics watch or a program's own mode the pass is not
    taken: the mode sees torch's operations, the same as without compiled kernels."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    (fast, seen_fast), (slow, seen_slow) = _step_under(Seen, True), _step_under(Seen, False)
    assert "aten.addcdiv_.default" in seen_fast.ops
    assert seen_fast.ops == seen_slow.ops
    assert torch.equal(_bytes(fast), _bytes(slow))


@needs_native
def test_autograd_still_refuses_a_graph_whose_weights_the_step_changed():
    """The classic mistake (backward, step, backward again through the same graph): torch's
    in-place check raises, with the pass as without it."""
    for fast in (True, False):
        w = torch.nn.Parameter(torch.randn(4, 4))
        opt = torch.optim.Adam([w], lr=0.1)
        with PortableMode("strict"), _nothing() if fast else native.fallback():
            loss = (w @ w).sum()
            loss.backward(retain_graph=True)
            opt.step()
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()


@needs_native
def test_tensors_and_values_the_pass_does_not_take_run_torchs_loop():
    """A ZeroTensor gradient, inference tensors, betas set outside the constructor's range after
    construction: torch's loop (its result or its error, and the state it leaves)."""
    assert not native_optim.applies(
        torch.zeros(3), torch._efficientzerotensor(3), torch.zeros(3), torch.zeros(3)
    )
    with torch.inference_mode():
        frozen = torch.zeros(3)
    assert not native_optim.applies(torch.zeros(3), torch.zeros(3), frozen, torch.zeros(3))

    def spoiled(fast: bool):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(6))
        opt = torch.optim.Adam([p], lr=0.1)
        opt.param_groups[0]["betas"] = (1.0, 0.999)  # bias correction 1 - 1**step = 0
        p.grad = torch.randn(6)
        with PortableMode("strict"), _nothing() if fast else native.fallback():
            with pytest.raises(ZeroDivisionError):
                opt.step()
        return [p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]]

    for a, b in zip(spoiled(True), spoiled(False), strict=True):
        assert torch.equal(_bytes(a), _bytes(b))
