"""Portable mode's kernels: their bits depend only on their inputs (layout, order and code path
do not move them), the compiled kernels and the torch fallbacks agree bit for bit, and each is
as accurate as docs/portable.md says (accuracy is a tolerance; every reproducibility claim here
is torch.equal)."""

import importlib.util
import itertools
import math
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import philox
from twice.portable.arithmetic.exact import exact_addmm, exact_matmul, exact_sum
from twice.portable.dispatch.mode import PortableError, PortableMode
from twice.portable.ops import conv as pconv
from twice.portable.ops import math as om
from twice.portable.ops import nn as pnn
from twice.portable.ops import norms

F64 = torch.float64
needs_native = pytest.mark.skipif(not native.available(), reason="twice._native was not built")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality, NaNs included (their positions; portable NaNs are canonical)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.isnan(), b.isnan())
        and (torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0)))
    )


def _values(seed=0) -> torch.Tensor:
    g = _gen(seed)
    specials = [0.0, -0.0, 1e-300, -5e-324, 700.0, -740.0, 800.0, -800.0, 1.0, -1.0, 0.5, 6.0]
    specials += [5.99, -6.5, 1e-10, math.inf, -math.inf, math.nan, 0.3465, 20.0, -20.0]
    return torch.cat(
        [
            torch.randn(4000, generator=g, dtype=F64) * 4,
            torch.rand(4000, generator=g, dtype=F64) * 40 - 20,
            torch.tensor(specials, dtype=F64),
        ]
    )


def both(fn):
    """fn() with the compiled kernels, and with torch operations only."""
    fast = fn()
    with native.fallback():
        slow = fn()
    return fast, slow


# Philox: the published answers.


def test_philox_known_answers():
    # Random123's kat_vectors for philox4x32_10
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for counter, key, expected in cases:
        words = philox.philox_words([torch.tensor([c]) for c in counter], key[0] | key[1] << 32)
        assert [int(w) for w in words] == expected


def test_random_streams_look_random_and_follow_the_generator():
    n = philox.normal(200_000, 7)
    u = philox.uniform(200_000, 8)
    assert abs(float(n.mean())) < 0.01 and abs(float(n.std()) - 1) < 0.01
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    assert sorted(philox.randperm(100, 3).tolist()) == list(range(100))
    torch.manual_seed(5)
    first = philox.draw_key()
    torch.manual_seed(5)
    assert philox.draw_key() == first  # keyed from torch's generator: manual_seed replays it
    assert philox.draw_key() != first


# The compiled kernels and the fallbacks: the same bits.


@needs_native
@pytest.mark.parametrize(
    "name", ["sqrt", "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "silu"]
)
def test_elementwise_native_equals_fallback(name):
    x = _values()
    for inp in (x, x.float().double()):
        if name in ("sqrt", "log"):
            inp = inp.abs()
        fast, slow = both(lambda inp=inp: getattr(ew, name)(inp))
        assert _bits_equal(fast, slow), name


@needs_native
def test_activation_gradients_and_random_native_equal_fallback():
    x = _values(1)
    g = torch.randn(x.shape, generator=_gen(2), dtype=F64)
    for approximate in ("none", "tanh"):
        assert _bits_equal(*both(lambda a=approximate: ew.gelu(x, a)))
        assert _bits_equal(*both(lambda a=approximate: ew.gelu_backward(g, x, a)))
    assert _bits_equal(*both(lambda: ew.silu_backward(g, x)))
    assert _bits_equal(*both(lambda: ew.softplus(x, 1.5, 20.0)))
    for count in (0, 1, 7, 1000):
        assert torch.equal(*both(lambda c=count: philox.uniform(c, 99)))
        assert torch.equal(*both(lambda c=count: philox.normal(c, 99)))


@needs_native
def test_products_sums_and_norms_native_equal_fallback():
    g = _gen(3)
    m = torch.randn(37, 53, 11, generator=g) * torch.rand(37, 1, 1, generator=g)
    for dims in [None, (0,), (1,), (2,), (0, 2), (1, 2)]:
        for precision in (torch.float32, F64):
            for keepdim in (False, True):
                fast, slow = both(lambda d=dims, p=precision, k=keepdim: exact_sum(m, d, k, F64, p))
                assert torch.equal(fast, slow), (dims, precision, keepdim)
    for dt in (torch.float32, F64):
        for a_shape, b_shape in [((40, 70), (70, 30)), ((3, 40, 70), (3, 70, 30))]:
            a = torch.randn(*a_shape, generator=g).to(dt)
            b = torch.randn(*b_shape, generator=g).to(dt)
            bt = b.transpose(-1, -2).contiguous().transpose(-1, -2)
            assert torch.equal(*both(lambda: exact_matmul(a, b)))
            assert torch.equal(*both(lambda bt=bt: exact_matmul(a, bt)))
            bias = torch.randn(b_shape[-1], generator=g).to(dt)
            assert torch.equal(*both(lambda: exact_addmm(bias, a, b, dt)))
        s, t1, t2 = (torch.randn(1000, generator=g).to(dt) for _ in range(3))
        for fn in (
            lambda: om._addcmul(s, t1, t2, value=-0.37),
            lambda: om._addcdiv(s, t1, t2, value=0.1),
            lambda: om._lerp(s, t1, 0.1),
            lambda: om._lerp(s, t1, 0.9),
            lambda: om._add(s, t1, alpha=-0.001),
            lambda: om._addcmul_(s.clone(), t1, t2, value=-0.37),  # the in-place kernels
            lambda: om._addcdiv_(s.clone(), t1, t2, value=0.1),
            lambda: om._lerp_(s.clone(), t1, 0.9),
            lambda: om._add_(s.clone(), t1, alpha=-0.001),
        ):
            assert torch.equal(*both(fn))
        w, b = torch.randn(3, generator=g).to(dt), torch.randn(3, generator=g).to(dt)
        # small planes, planes longer than the C kernels' chunks and lanes, and a non-finite value
        cases = [(4, 3, 5, 6), (3, 3, 17, 19), "inf"]
        for shape, train in itertools.product(cases, (True, False)):
            x = torch.randn(shape if shape != "inf" else (2, 3, 9), generator=g).to(dt) * 3 + 1
            if shape == "inf":
                x[1, 2, 4] = math.inf
            go = torch.randn(x.shape, generator=g).to(dt)

            def batch_norm(train=train, x=x, go=go):
                rm, rv = torch.zeros(3, dtype=dt), torch.ones(3, dtype=dt)
                out, sm, si = norms.batch_norm(x, w, b, rm, rv, train, 0.1, 1e-5)
                saved = (sm, si) if train else (None, None)
                grads = norms.batch_norm_backward(
                    go, x, w, rm, rv, *saved, train, 1e-5, [True, True, True]
                )
                return torch.cat([t.reshape(-1).double() for t in (out, sm, si, rm, rv, *grads)])

            assert _bits_equal(*both(batch_norm)), (shape, train)
    for shape, normalized in [((6, 9, 16), [16]), ((5, 7), [7]), ((3, 4, 5, 6), [5, 6])]:
        x = torch.randn(*shape, generator=g) * 3 + 1
        go = torch.randn(*shape, generator=g)
        w, b = torch.randn(*normalized, generator=g), torch.randn(*normalized, generator=g)
        for affine in ((w, b), (None, None)):

            def layer_norm(affine=affine, x=x, go=go, normalized=normalized):
                out, mean, rstd = norms.layer_norm(x, normalized, *affine, 1e-5)
                grads = norms.layer_norm_backward(
                    go, x, normalized, mean, rstd, *affine, [True, True, True]
                )
                parts = (out, mean, rstd, *grads)
                return torch.cat([t.reshape(-1).double() for t in parts if t is not None])

            assert torch.equal(*both(layer_norm))


# Bits that depend on the values alone.


def test_sqrt_is_correctly_rounded_on_both_paths():
    g = _gen(4)
    x = torch.cat(
        [
            torch.rand(200_000, generator=g, dtype=F64) * 10,
            torch.exp(torch.randn(200_000, generator=g, dtype=F64) * 200),
            torch.tensor([0.0, 5e-324, 1.7e308, 2.0, 4.0, 1e-310], dtype=F64),
        ]
    )
    expected = torch.from_numpy(np.sqrt(x.numpy()))
    fast, slow = both(lambda: ew.sqrt(x))
    assert torch.equal(fast, expected) and torch.equal(slow, expected)
    x32 = torch.rand(200_000, generator=g) * 100
    assert torch.equal(ew.sqrt(x32.double()).float(), torch.from_numpy(np.sqrt(x32.numpy())))
    # torch's own is not, which is why portable mode replaces it
    assert not torch.equal(torch.sqrt(x32), torch.from_numpy(np.sqrt(x32.numpy())))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 70),
    st.integers(1, 9),
    st.integers(0, 2**31),
    st.sampled_from([torch.float32, F64]),
)
def test_products_do_not_depend_on_layout_or_order(m, k, n, seed, dtype):
    g = _gen(seed)
    a = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    out = exact_matmul(a, b)
    # a transposed layout, a non-contiguous view, the sum order permuted: the same bits
    a_t = a.t().contiguous().t()
    b_wide = torch.zeros(k, 2 * n, dtype=dtype)
    b_wide[:, ::2] = b
    perm = torch.randperm(k, generator=g)
    assert torch.equal(exact_matmul(a_t, b), out)
    assert torch.equal(exact_matmul(a, b_wide[:, ::2]), out)
    assert torch.equal(exact_matmul(a[:, perm], b[perm]), out)
    assert torch.equal(exact_matmul(a.unsqueeze(0), b.unsqueeze(0))[0], out)
    # accurate to a few units of the float32 result on the sum of magnitudes
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    tol = 2e-6 if dtype == torch.float32 else 1e-14
    assert bool(((out.double() - ref).abs() <= tol * scale + 1e-300).all())


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.integers(0, 2**31),
    st.sampled_from([torch.float32, F64]),
)
def test_sums_do_not_depend_on_order(shape, seed, dtype):
    g = _gen(seed)
    x = (torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 3)).to(
        dtype
    )
    dim = int(torch.randint(0, len(shape), (1,), generator=g))
    total = exact_sum(x, (dim,))
    perm = torch.randperm(shape[dim], generator=g)
    assert torch.equal(exact_sum(x.index_select(dim, perm), (dim,)), total)
    assert torch.equal(exact_sum(x.movedim(dim, 0).contiguous(), (0,)), total)
    assert torch.equal(exact_sum(x, (dim,), keepdim=True).squeeze(dim), total)
    ref = x.double().sum(dim)
    biggest = float(x.double().abs().max())
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert bool(((total.double() - ref).abs() <= tol * (ref.abs() + biggest)).all())


def test_nonfinite_values_follow_ieee():
    a = torch.tensor([[1.0, math.inf, 0.0], [2.0, 3.0, math.nan], [-math.inf, 1.0, 1.0]])
    b = torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])
    out, ref = exact_matmul(a, b), a.double() @ b.double()
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(out.double(), 7.0), torch.nan_to_num(ref, 7.0))
    x = torch.tensor([[1.0, math.inf, -math.inf], [math.nan, 1.0, 2.0], [1.0, 2.0, math.inf]])
    s, r = exact_sum(x, (1,)), x.double().sum(1)
    assert torch.equal(s.isnan(), r.isnan()) and s[2] == math.inf
    s, r = exact_sum(x, (0,)), x.double().sum(0)  # over the leading dimension: column sums
    assert torch.equal(s.isnan(), r.isnan()) and s[1] == math.inf
    assert _bits_equal(*both(lambda: exact_sum(x, (0,))))


# Accuracy against torch in float64: a statement of accuracy, not of reproducibility.


@pytest.mark.parametrize(
    "name, ulps",
    [("exp", 2), ("log", 3), ("log1p", 3), ("expm1", 3), ("tanh", 3), ("sigmoid", 3), ("erf", 3)],
)
def test_elementwise_functions_are_accurate(name, ulps):
    x = _values(5)
    x = x[torch.isfinite(x)]
    if name == "log":
        x = x.abs() + 1e-300
    if name == "log1p":
        x = x.abs() * 0.1 - 0.5
    ours, theirs = getattr(ew, name)(x), getattr(torch, name)(x)
    keep = torch.isfinite(theirs) & (theirs.abs() > 1e-300)
    rel = ((ours - theirs).abs() / theirs.abs())[keep]
    assert float(rel.max()) <= ulps * 2.0**-52


def test_network_operations_match_torch_in_float64():
    g = _gen(6)
    x = torch.randn(4, 7, generator=g, dtype=F64)
    close = {"rtol": 1e-12, "atol": 1e-12}
    assert torch.allclose(pnn.softmax(x, 1), torch.softmax(x, 1), **close)
    assert torch.allclose(pnn.log_softmax(x, 1), torch.log_softmax(x, 1), **close)
    target = torch.tensor([0, 3, 6, 2])
    loss, _ = pnn.nll_loss(torch.log_softmax(x, 1), target, None, 1, -100)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(x, target), **close)
    out, *_ = norms.layer_norm(x, [7], None, None, 1e-5)
    assert torch.allclose(out, torch.nn.functional.layer_norm(x, [7]), **close)
    img = torch.randn(2, 3, 9, 8, generator=g, dtype=F64)
    w = torch.randn(5, 3, 3, 3, generator=g, dtype=F64)
    ours = pconv.convolution(img, w, None, [2, 1], [1, 0], [1, 2], False, [0, 0], 1)
    ref = torch.nn.functional.conv2d(img, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    assert torch.allclose(ours, ref, **close)
    go = torch.randn(ref.shape, generator=g, dtype=F64)
    settings = ([2, 1], [1, 0], [1, 2], False, [0, 0], 1, [True, True, True])
    grads = pconv.convolution_backward(go, img, w, [5], *settings)
    expected = torch.ops.aten.convolution_backward(go, img, w, [5], *settings)
    for mine, theirs in zip(grads, expected):
        assert torch.allclose(mine, theirs, **close)
    wg = torch.randn(6, 1, 3, 3, generator=g, dtype=F64)
    grouped = pconv.convolution(img, wg, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 3)
    ref = torch.nn.functional.conv2d(img, wg, padding=1, groups=3)
    assert torch.allclose(grouped, ref, **close)


@pytest.mark.parametrize(
    "build",
    [
        lambda: (torch.nn.Linear(5, 3), (4, 5)),
        lambda: (torch.nn.Conv2d(2, 3, 3, stride=2, padding=1), (2, 2, 6, 5)),
        lambda: (torch.nn.Conv1d(2, 4, 3, groups=2), (2, 2, 7)),
        lambda: (torch.nn.LayerNorm(6), (3, 6)),
        lambda: (torch.nn.BatchNorm1d(4), (5, 4)),
        lambda: (torch.nn.GroupNorm(2, 4), (3, 4, 5)),
        lambda: (torch.nn.GELU(), (3, 4)),
        lambda: (torch.nn.GELU("tanh"), (3, 4)),
        lambda: (torch.nn.SiLU(), (3, 4)),
        lambda: (torch.nn.Softplus(), (3, 4)),
        lambda: (torch.nn.Tanh(), (3, 4)),
        lambda: (torch.nn.Sigmoid(), (3, 4)),
        lambda: (torch.nn.LogSoftmax(1), (3, 4)),
        lambda: (torch.nn.Softmax(1), (3, 4)),
        lambda: (torch.nn.Embedding(5, 3), None),
    ],
)
def test_gradients_under_portable_mode_pass_gradcheck(build):
    torch.manual_seed(0)
    module, shape = build()
    module = module.double()
    if shape is None:
        idx = torch.tensor([[0, 2, 2], [4, 0, 1]])

        def fn(weight):
            return torch.nn.functional.embedding(idx, weight)

        inputs = (module.weight.detach().clone().requires_grad_(),)
    else:
        inputs = (torch.randn(*shape, dtype=F64, requires_grad=True),)

        def fn(x):
            return module(x)

    mode = PortableMode("audit")
    with mode:
        assert torch.autograd.gradcheck(fn, inputs)
    # gradcheck's own comparisons (allclose) are the only ops left to torch
    assert set(mode.uncovered) <= {"aten::allclose.default", "aten::isclose.default"}


def test_training_follows_plain_torch_within_float_noise():
    """From the same weights and batches, portable arithmetic trains as torch's does: the loss
    curves agree to float32 noise (only the random streams differ, and none is drawn here)."""
    import contextlib
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.GELU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )
    teacher = torch.randn(3 * 8 * 8, 10)
    inputs = [torch.randn(32, 3, 8, 8) for _ in range(30)]
    batches = [(x, (x.flatten(1) @ teacher).argmax(1)) for x in inputs]
    curves = []
    for portable in (False, True):
        net = copy.deepcopy(model)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        losses = []
        with PortableMode("strict") if portable else contextlib.nullcontext():
            for x, y in batches:
                loss = torch.nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        curves.append(losses)
    plain, portable = curves
    assert plain[-1] < plain[0] * 0.9  # it trains
    assert all(abs(p - q) <= 1e-4 * abs(q) for p, q in zip(portable, plain)), (portable, plain)


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


# The mode's policies for what it does not cover.


def test_strict_names_the_uncovered_op_and_line():
    x = torch.randn(5)
    with pytest.raises(PortableError) as raised, PortableMode("strict"):
        torch.fft.rfft(x)
    assert "aten::_fft_r2c" in str(raised.value) and "test_portable.py" in str(raised.value)
    assert "twice audit --portable" in str(raised.value)


def test_warn_and_audit_list_uncovered_ops_and_run_them():
    x = torch.randn(5)
    mode = PortableMode("warn")
    with pytest.warns(UserWarning, match="aten::_fft_r2c"), mode:
        out = torch.fft.rfft(x)
    assert torch.equal(out, torch.fft.rfft(x)) and mode.uncovered["aten::_fft_r2c.default"]
    quiet = PortableMode("audit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with quiet:
            torch.fft.rfft(x)
            torch.fft.rfft(x)
    assert quiet.uncovered["aten::_fft_r2c.default"]["count"] == 2


def test_integer_and_exact_ops_pass_through_untouched():
    with PortableMode("strict"):
        ints = torch.arange(10).sum()
        y = torch.randn(4, 3)
        z = (y * 2 + y / 3).relu().amax(1)
    assert int(ints) == 45 and z.shape == (4,)


TRITON_CHECK = """
import math, torch
from twice.portable import native
from twice.portable.arithmetic import philox
from twice.portable.arithmetic import elementwise as ew
native._state["gpu_tests"] = True  # run the Triton kernels on CPU tensors, in the interpreter
g = torch.Generator().manual_seed(0)
specials = [0.0, -0.0, 1e-300, 5e-324, 700.0, -740.0, 800.0, 1.0, -1.0, 6.0, 5.99, -6.5, 1e-10,
            math.inf, -math.inf, math.nan, 0.3465, 20.0, -20.0]
x = torch.cat([torch.randn(3000, generator=g, dtype=torch.float64) * 4,
               torch.tensor(specials, dtype=torch.float64)])
calls = {n: (lambda t, n=n: getattr(ew, n)(t)) for n in
         ["exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "silu"]}
calls["gelu"] = lambda t: ew.gelu(t, "none")
calls["gelu_tanh"] = lambda t: ew.gelu(t, "tanh")
for name, call in calls.items():
    for inp in (x, x.float()):
        arg = inp.abs() if name == "log" else inp
        ours = native.gpu(name, arg, torch.float64)
        with native.fallback():
            theirs = call(arg.double())
        assert torch.equal(ours.isnan(), theirs.isnan()), name
        assert torch.equal(torch.nan_to_num(ours, 7.0), torch.nan_to_num(theirs, 7.0)), name
for count in (1, 7, 1000):
    ours = native.gpu_uniform(count, 12345, "cpu")
    normals = philox.normal(count, 12345, "cpu")  # Box-Muller over the kernel's uniforms
    with native.fallback():
        assert torch.equal(ours, philox.uniform(count, 12345)), count
        assert torch.equal(normals, philox.normal(count, 12345)), count
print("same bits")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs Triton (the test extra installs it on Linux x86-64)",
)
@pytest.mark.slow  # costly on two cores; run by make test-slow and CI
def test_the_triton_kernels_give_the_fallbacks_bits_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert result.returncode == 0 and "same bits" in result.stdout, result.stderr[-3000:]


def test_scratch_tensors_take_every_form_of_shape():
    for shape, expected in [(5, (5,)), ((), ()), ((2, 3), (2, 3)), (torch.Size([4, 1]), (4, 1))]:
        assert native.empty(shape, torch.float64).shape == expected


@pytest.mark.skipif(
    not native.available() or platform.libc_ver()[0] != "glibc", reason="needs the C build on glibc"
)
def test_portable_mode_has_malloc_keep_freed_memory():
    assert native.keep_memory() is True
    assert native.keep_memory() is True  # once per process; asking again is harmless


def test_compiled_kernels_are_called_by_name():
    """Every call into a compiled kernel names each argument (the C entry points take keywords:
    a name it does not know is a TypeError), so that no call passes a dozen pointers and sizes
    by position. Only p_init takes its tables as they come."""
    import ast

    from twice.portable import native as compiled
    from twice.portable.native import norms as native_norms

    calls = 0
    for module in (compiled, native_norms):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if not node.func.attr.startswith("p_") or node.func.attr == "p_init":
                continue
            calls += 1
            assert not node.args, f"{module.__name__}:{node.lineno} {node.func.attr}: by name"
    assert calls >= 15


def test_a_compiled_kernel_refuses_an_argument_it_does_not_name():
    from twice import _native

    if not hasattr(_native, "p_uniform"):
        pytest.skip("twice._native was built without a C compiler")
    with pytest.raises(TypeError):
        _native.p_uniform(key=1, out=(0, 0, 1), output=0)
    with pytest.raises(TypeError):
        _native.p_uniform(key=1)


def test_one_table_names_every_compiled_kernel_and_coefficient():
    """coefficients.py's kernel table is the C module's (p_kernels), the Python wrappers' and
    the Triton kernels' codes; every named offset of the flattened coefficient table holds the
    value of that name."""
    from twice import _native
    from twice.portable import native as compiled
    from twice.portable.arithmetic import coefficients

    if not hasattr(_native, "p_kernels"):
        pytest.skip("twice._native was built without a C compiler")
    assert _native.p_kernels() == (coefficients.UNARY_KERNELS, coefficients.BINARY_KERNELS)
    assert compiled._module is not None  # the build's table is the table: the module is used
    assert list(compiled._UNARY) == list(coefficients.UNARY_KERNELS)
    flat = [v for poly in coefficients.KERNEL_ARGS[0] for v in poly]
    flat += list(coefficients.KERNEL_ARGS[1])
    layout = coefficients.table_layout()
    for name in coefficients.CONSTANTS:
        at, _ = layout[name]
        expected = math.pi / 2 if name == "HALF_PI" else getattr(coefficients, name)
        assert flat[at] == expected, name
    at, length = layout["erf"]
    assert flat[at : at + length] == coefficients.ERF_TAYLOR
