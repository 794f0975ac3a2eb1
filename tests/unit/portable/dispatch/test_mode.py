"""dispatch/mode: the dispatch mode routes every op of a training step (gradients pass
gradcheck, training follows plain torch), and its policies for ops it does not cover name
them with the user's line."""

import os
import threading
import warnings

import pytest
import torch
from torch import nn

from twice.portable.dispatch.mode import PortableError, PortableMode
from unit.portable.bits import (
    F64,
    same_bits,
)


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


def test_strict_names_the_uncovered_op_and_line():
    x = torch.randn(3, 3)
    with pytest.raises(PortableError) as raised, PortableMode("strict"):
        torch.linalg.eigvals(x)
    assert "aten::linalg_eig" in str(raised.value) and "test_mode.py" in str(raised.value)
    assert "twice audit --portable" in str(raised.value)


def test_warn_and_audit_list_uncovered_ops_and_run_them():
    x = torch.randn(3, 3)
    mode = PortableMode("warn")
    with pytest.warns(UserWarning, match="aten::linalg_eig"), mode:
        out = torch.linalg.eigvals(x)
    assert torch.equal(out, torch.linalg.eigvals(x)) and mode.uncovered["aten::linalg_eig.default"]
    quiet = PortableMode("audit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with quiet:
            torch.linalg.eigvals(x)
            torch.linalg.eigvals(x)
    assert quiet.uncovered["aten::linalg_eig.default"]["count"] == 2


def test_sparse_tensors_are_refused_by_name_where_a_kernel_would_read_them_dense():
    """A sparse tensor that reaches a kernel written for strided memory (a sum, a product, an
    elementwise function), whatever its dtype, is refused by name, never a crash inside the
    kernel; so is any operation, a view or a metadata-free exact one included, on an
    uncoalesced COO tensor (torch would add its duplicates in its own order). Going to sparse
    and back, a gradient through it, adding coalesced sparse tensors and asking a sparse tensor
    its count of values and its total are exact and covered."""
    dense = torch.tensor([[0.0, 2.0, 0.5], [3.0, 0.0, -1.0]])
    loose = torch.sparse_coo_tensor([[0, 0, 1], [1, 1, 2]], [1.0, 2.0, 4.0], (2, 3))
    int_loose = torch.sparse_coo_tensor([[0, 0], [1, 1]], torch.tensor([1, 1]), (2, 3))
    calls = [
        lambda: dense.to_sparse().sum(0),
        lambda: torch.sparse.mm(dense.to_sparse(), dense.t()),
        lambda: dense.to_sparse().exp(),
        lambda: loose * 2.0,
        lambda: loose.select(0, 0),
        lambda: torch.isinf(loose),
        lambda: dense + loose,
        lambda: dense + int_loose,
        lambda: int_loose.to_sparse().sin(),
        lambda: torch.addcmul(dense, dense.to_sparse(), dense),
    ]
    for index, call in enumerate(calls):
        with pytest.raises(PortableError, match="not covered") as raised, PortableMode("strict"):
            call()
        assert "sparse" in str(raised.value), index
    leaf = dense.clone().requires_grad_()
    with PortableMode("strict"):
        back = leaf.to_sparse().to_dense()
        (grad,) = torch.autograd.grad(back, leaf, torch.full_like(dense, 3.0))
        masked = dense.sparse_mask(dense.to_sparse())
        sp = dense.to_sparse()
        added = [dense + sp, dense - sp, dense.add(sp, alpha=0.5)]
        csr = dense.to_sparse_csr() + dense.to_sparse_csr()
        count, flag = loose._nnz(), loose.is_coalesced()
        total = dense.to_sparse().sum()
    plain = torch.autograd.grad(leaf.to_sparse().to_dense(), leaf, torch.full_like(dense, 3.0))
    assert torch.equal(back, dense) and torch.equal(grad, plain[0])  # 3 where a value is held
    assert torch.equal(masked.to_dense(), dense)
    want = [dense + dense, torch.zeros_like(dense), dense + dense * 0.5]
    assert all(torch.equal(g.to_dense(), w) for g, w in zip(added, want))
    assert torch.equal(csr.to_dense(), dense + dense) and (count, flag) == (3, False)
    assert float(total) == 4.5


def test_an_integer_tensor_through_a_floating_point_function_takes_the_portable_kernel():
    """An operation whose operands are all integers but whose result is floating-point (`exp`
    of an integer tensor, a true division) gives the bits of the same operation on the
    promoted tensor through the portable kernels, not torch's own; integer results stay
    torch's."""
    x = torch.arange(-60, 140)
    ops = [torch.exp, torch.sin, torch.sigmoid, torch.erf, torch.tanh, torch.log1p,
           lambda t: t.abs().sqrt(), lambda t: t / 7, lambda t: torch.atan2(t, t + 3),
           lambda t: t.abs() ** 0.5,
           lambda t: torch.special.zeta(t.abs() + 2, t.abs() + 1)]  # fmt: skip
    unlike_torch = 0
    for index, op in enumerate(ops):
        with PortableMode("strict"):
            got, want = op(x), op(x.float())
        assert got.dtype == torch.float32 and same_bits(got, want), index
        unlike_torch += not same_bits(got, op(x))  # twice's own functions, not torch's
    assert unlike_torch >= 3
    with PortableMode("strict"):
        ints = (x * 3 + 1) // 2
    assert ints.dtype == torch.int64 and torch.equal(ints, (x * 3 + 1) // 2)


def test_integer_and_exact_ops_pass_through_untouched():
    with PortableMode("strict"):
        ints = torch.arange(10).sum()
        y = torch.randn(4, 3)
        z = (y * 2 + y / 3).relu().amax(1)
    assert int(ints) == 45 and z.shape == (4,)


def test_torch_compile_runs_eagerly_through_the_mode():
    from twice.portable.dispatch import mode as portable

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(4, 8)
    active = portable.enable("strict")
    try:
        compiled = torch.compile(model)
        assert torch.equal(compiled(x), model(x))
        assert active.compiled == 1 and os.environ["TORCHDYNAMO_DISABLE"] == "1"
        with pytest.raises(PortableError, match="linalg_eig"):
            torch.compile(lambda t: torch.linalg.eigvals(t[:, :4]))(x)  # routed, not hidden
    finally:
        portable.disable()
    assert active.compiled == 2 and "TORCHDYNAMO_DISABLE" not in os.environ


_ON_EMPTY = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, 0),
    "softmin": lambda x: nn.functional.softmin(x, -1),
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(),
    "cumsum": lambda x: x.cumsum(0),
    "logcumsumexp": lambda x: x.logcumsumexp(-1),
    "logsumexp": lambda x: x.logsumexp(-1),
    "matmul": lambda x: x.reshape(-1, x.shape[-1]) @ x.reshape(-1, x.shape[-1]).T,
    "layer_norm": lambda x: nn.functional.layer_norm(x, x.shape[-1:]),
    "exp": torch.exp,
    "norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "var": lambda x: x.var(-1),
    "sort": lambda x: x.sort(-1).values,
}


@pytest.mark.parametrize("shape", [(0,), (5, 0), (0, 3), (2, 0, 4), (3, 4, 0)])
@pytest.mark.parametrize("name", sorted(_ON_EMPTY))
def test_an_op_on_empty_operands_gives_torchs_result_or_torchs_error(name, shape):
    """No value is computed from an empty operand: the result (empty, or an identity such as a
    sum's 0 and a mean's NaN) is torch's own, for every kernel, and an op torch refuses on
    empty operands is refused the same way, never a portable kernel's own error."""
    op, x = _ON_EMPTY[name], torch.zeros(shape)
    try:
        expected = op(x)
    except (RuntimeError, IndexError) as exc:
        with PortableMode("strict"), pytest.raises(type(exc)):
            op(x)
        return
    with PortableMode("strict"):
        found = op(x)
    assert found.shape == expected.shape
    assert torch.equal(found.nan_to_num(7.0), expected.nan_to_num(7.0))


def test_values_made_from_python_numbers_beside_empty_operands_are_the_kernels():
    """An op whose operands are all empty but whose result has values made from Python numbers
    (histogram edges over a range) takes its kernel: torch's own edges differ across
    instruction sets. The edges are those of the same call with data."""
    for dtype in (torch.float32, torch.float64):
        outside = torch.tensor([5.0], dtype=dtype)
        with PortableMode("strict"):
            empty = torch.histogram(torch.empty(0, dtype=dtype), bins=7, range=(0.1, 0.7))
            given = torch.histogram(outside, bins=7, range=(0.1, 0.7))
            dd = torch.histogramdd(torch.empty(0, 1, dtype=dtype), bins=[7], range=[0.1, 0.7])
        assert torch.equal(empty.bin_edges, given.bin_edges)
        assert torch.equal(dd.bin_edges[0], given.bin_edges)


def test_an_out_form_computes_in_outs_dtype_with_its_own_arguments():
    """An out= call is its functional overload taking the same positional arguments (arange's
    start, end and step), its result in out's dtype: a float64 out is not float32 values."""
    with PortableMode("strict"):
        spaced = torch.empty(7, dtype=torch.float64)
        torch.linspace(0.1, 0.7, 7, out=spaced)
        expected = torch.linspace(0.1, 0.7, 7, dtype=torch.float64)
        ranged = torch.empty(0, dtype=torch.float64)
        torch.arange(0.1, 0.7, 0.05, out=ranged)
        total = torch.empty((), dtype=torch.float64)
        torch.sum(torch.full((3,), 0.1), 0, out=total)
    assert torch.equal(spaced, expected)
    assert ranged.shape == (12,) and ranged.dtype == torch.float64
    assert total.item() == torch.full((3,), 0.1).double().sum().item()


def test_complex_operands_reach_only_the_kernels_written_for_them():
    """A complex tensor given to a kernel of real arithmetic (exp, mean, prod, cumsum) is
    refused by name, never computed on its real part; the complex FFTs take them."""
    z = torch.tensor([0.5 + 1j, -0.3 + 2j])
    for call in [
        lambda: torch.exp(z),
        lambda: z.mean(),
        lambda: z.prod(),
        lambda: z.cumsum(0),
        lambda: torch.sigmoid(z),
        lambda: torch.logsumexp(z, 0),
    ]:  # fmt: skip
        with pytest.raises(PortableError, match="complex arithmetic"), PortableMode("strict"):
            call()
    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    with PortableMode("strict"):
        back = torch.fft.ifft(torch.fft.fft(x)).real
    assert back.dtype == torch.float32 and float((back - x).abs().max()) < 1e-6  # a round trip


def test_random_draws_into_integer_tensors_come_from_philox_and_sums_stay_exact():
    """bernoulli_ and geometric_ into integer or boolean tensors draw from Philox like every
    portable random operation (not torch's own generator); bincount's integer weights keep
    torch's exact sums in every policy; a prim that stands for an aten op with a Tensor and a
    Scalar overload (prims.add) takes the Tensor one; a sum of coalesced sparse tensors is
    coalesced (torch's GPU kernel would leave it not), and none is written in place."""
    z = torch.zeros(64, dtype=torch.long)
    for draw in (lambda: z.clone().bernoulli_(0.5), lambda: z.clone().geometric_(0.5),
                 lambda: torch.zeros(64, dtype=torch.bool).bernoulli_(0.5)):  # fmt: skip
        torch.manual_seed(0)
        with PortableMode("strict"):
            portable = draw()
        torch.manual_seed(0)
        assert not torch.equal(portable, draw())
    x, w = torch.tensor([0, 1, 1, 3]), torch.tensor([5, 6, 7, 8])
    for policy in ("strict", "warn", "audit"):
        with PortableMode(policy):
            counts = torch.bincount(x, weights=w)
        assert counts.tolist() == [5.0, 13.0, 0.0, 8.0]
    y = torch.randn(5)
    with PortableMode("strict"):
        assert torch.equal(torch.ops.prims.add(y, y), y + y)
    c = torch.tensor([[0.0, 1.5, 0.0], [2.5, 0.0, 0.0]]).to_sparse()
    with PortableMode("strict"):
        total = c + c
    assert (
        total.is_coalesced()
        and total._nnz() == 2
        and torch.equal(total.to_dense(), 2 * c.to_dense())
    )
    with pytest.raises(PortableError, match="in-place sum"), PortableMode("strict"):
        c.clone().add_(c)


_DIM_CALLS = {
    "sum": lambda x, d: x.sum(d),
    "sum dtype": lambda x, d: x.sum(d, dtype=torch.float64),
    "nansum": lambda x, d: x.nansum(d),
    "mean": lambda x, d: x.mean(d),
    "cumsum": lambda x, d: x.cumsum(d),
    "cumprod": lambda x, d: x.cumprod(d),
    "logcumsumexp": lambda x, d: x.logcumsumexp(d),
    "norm": lambda x, d: x.norm(dim=d),
    "vector_norm": lambda x, d: torch.linalg.vector_norm(x, dim=d),
    "var": lambda x, d: x.var(d),
    "std": lambda x, d: x.std(d),
    "amax": lambda x, d: x.amax(d),
    "prod": lambda x, d: x.prod(d),
    "softmax": lambda x, d: x.softmax(d),
    "log_softmax": lambda x, d: x.log_softmax(d),
    "logsumexp": lambda x, d: x.logsumexp(d),
    "fft": lambda x, d: torch.fft.fft(x, dim=d),
    "rfftn": lambda x, d: torch.fft.rfftn(x, dim=(d,)),
    "cat": lambda x, d: torch.cat([x, x], d),
    "flip": lambda x, d: x.flip(d),
    "sort": lambda x, d: x.sort(d)[0],
    "cummax": lambda x, d: x.cummax(d)[0],
    "renorm": lambda x, d: x.renorm(2, d, 1.0),
    "bf16 sum": lambda x, d: x.bfloat16().sum(d, dtype=torch.float32),
}


@pytest.mark.parametrize("name", sorted(_DIM_CALLS))
def test_a_dimension_out_of_range_is_torchs_index_error(name):
    """Every dimension from -4 to 3 of a 2-d tensor (and 0-d): under the mode the call raises
    exactly where torch does (torch's IndexError where torch's is one; the mode checks every
    kernel's `dim` arguments, operands.check_dims), and otherwise gives torch's shape."""
    call = _DIM_CALLS[name]
    for x in (torch.randn(4, 3), torch.randn(())):
        for d in range(-4, 4):
            try:
                expected = call(x, d).shape
            except (IndexError, RuntimeError) as exc:
                expected = type(exc)
            try:
                with PortableMode("strict"):
                    got = call(x, d).shape
            except (IndexError, RuntimeError) as exc:
                # where torch's kernel checks something else first (renorm: the rank), an error
                got = type(exc) if expected is not RuntimeError else RuntimeError
            assert got == expected, (x.dim(), d)


def test_an_einsum_of_three_operands_contracts_left_to_right_whether_opt_einsum_is_there():
    """torch.einsum asks opt_einsum for a contraction order where that package is installed, so
    a package's presence would choose the products (and their bits). Under the mode the order
    is left to right on every machine; the switch is restored on leaving."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 3, generator=g, dtype=torch.float64)
    b = torch.randn(3, 40, generator=g, dtype=torch.float64)
    c = torch.randn(40, 2, generator=g, dtype=torch.float64)
    before = torch.backends.opt_einsum.enabled
    with PortableMode("strict"):
        assert torch.backends.opt_einsum.enabled is False
        with PortableMode("strict"):  # the mode enters again inside itself
            pass
        assert torch.backends.opt_einsum.enabled is False
        got = torch.einsum("ij,jk,kl->il", a, b, c)
        left_to_right = (a @ b) @ c
    assert torch.backends.opt_einsum.enabled == before
    assert torch.equal(got, left_to_right)


def _in_a_thread(function):
    box = {}

    def run():
        try:
            box["value"] = function()
        except Exception as exc:  # the thread's error, for the test's thread to see
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return box


def test_a_thread_the_program_starts_runs_under_the_mode_enable_installed():
    """A dispatch mode is its thread's own: a thread the program starts after `enable` enters
    the mode as it starts, so its operations are routed (the same bits as the enabling thread's,
    an uncovered one refused) and not torch's kernels, unseen."""
    from twice.portable.dispatch import mode as portable
    from twice.portable.dispatch import switches

    x = torch.linspace(-3, 3, 10_001, dtype=torch.float32) ** 3
    portable.enable("strict")
    try:
        here = [x.sum(), torch.exp(x[:50]), torch.cumsum(x, 0)]
        there = _in_a_thread(lambda: [x.sum(), torch.exp(x[:50]), torch.cumsum(x, 0)])
        refused = _in_a_thread(lambda: torch.linalg.eigvals(torch.eye(3)))
    finally:
        portable.disable()
    assert all(same_bits(a, b) for a, b in zip(here, there["value"]))
    assert isinstance(refused.get("error"), PortableError)
    assert _in_a_thread(lambda: torch.linalg.eigvals(torch.eye(3))).get("value") is not None
    import gc

    gc.collect()
    assert switches._state["count"] == 0  # every thread's entry left: settings restored


def test_disable_from_another_thread_leaves_the_enabling_threads_mode_in_place():
    from twice.portable.dispatch import mode as portable

    active = portable.enable("strict")
    try:
        _in_a_thread(portable.disable)
        assert portable.active() is active
        with pytest.raises(PortableError, match="linalg_eig"):
            torch.linalg.eigvals(torch.eye(3))
    finally:
        portable.disable()
    assert portable.active() is None
    torch.linalg.eigvals(torch.eye(3))  # torch's own again


def test_after_disable_a_thread_started_under_the_mode_runs_torchs_operations():
    """A thread started while the mode was enabled keeps its entry until it ends (a mode is
    its thread's own), but once `disable` retires the mode it runs torch's operations, and the
    settings are the program's again at once, not when that thread ends."""
    from twice.portable.dispatch import mode as portable
    from twice.portable.dispatch import switches

    checked, go, done, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def worker():
        seen["before"] = _refuses_eig()
        checked.set()
        go.wait(10)
        seen["after"] = _refuses_eig()
        done.set()

    before = [setting.get() for setting in switches.SETTINGS]
    portable.enable("strict")
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        checked.wait(10)
    finally:
        portable.disable()
    assert [setting.get() for setting in switches.SETTINGS] == before
    mkldnn = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(not mkldnn)  # the program's own setting, after disable
    try:
        go.set()
        done.wait(10)
        thread.join(10)
        import gc

        gc.collect()
        assert torch._C._get_mkldnn_enabled() is (not mkldnn)  # not put back by the thread
    finally:
        torch._C._set_mkldnn_enabled(mkldnn)
    assert seen == {"before": True, "after": False}


def _refuses_eig() -> bool:
    try:
        torch.linalg.eigvals(torch.eye(3))
    except PortableError:
        return True
    return False


def test_a_pool_made_before_enable_runs_its_workers_under_the_mode():
    """ThreadPoolExecutor starts its threads as work arrives: those started after `enable`
    enter the mode."""
    from concurrent.futures import ThreadPoolExecutor

    from twice.portable.dispatch import mode as portable

    pool = ThreadPoolExecutor(max_workers=2)
    portable.enable("strict")
    try:
        refused = [pool.submit(_refuses_eig).result(10) for _ in range(3)]
    finally:
        portable.disable()
        pool.shutdown()
    assert refused == [True] * 3


def test_strict_refuses_an_uncovered_operation_at_every_call():
    """A program that catches the error and calls again gets it again, not torch's kernel."""
    with PortableMode("strict") as mode:
        for _ in range(3):
            with pytest.raises(PortableError, match="linalg_eig"):
                torch.linalg.eigvals(torch.eye(3))
    assert list(mode.uncovered) == ["aten::linalg_eig.default"]


def test_a_thread_started_under_the_mode_leaves_it_when_it_ends(monkeypatch):
    """torch can abort a process whose thread ended with a dispatch mode on its stack: the start
    of a thread under the mode pushes it before the thread's work and pops it after, even when
    the work raises. (Run here in this thread, on a stand-in for threading's own start.)"""
    from torch.utils._python_dispatch import (
        _disable_current_modes,
        _get_current_dispatch_mode_stack,
    )

    from twice.portable.dispatch import mode as portable

    inside = []

    def bootstrap(thread):
        inside.append([type(m).__name__ for m in _get_current_dispatch_mode_stack()])
        if thread == "raises":
            raise ValueError("the thread's work failed")

    portable.enable("strict")
    try:
        monkeypatch.setitem(portable._enabled, "bootstrap", bootstrap)
        with _disable_current_modes():  # this thread's own entry set aside, as in a new one
            portable._started_under_the_mode("works")
            assert _get_current_dispatch_mode_stack() == []
            with pytest.raises(ValueError):
                portable._started_under_the_mode("raises")
            assert _get_current_dispatch_mode_stack() == []
    finally:
        monkeypatch.undo()
        portable.disable()
    assert inside == [["_Sharing"], ["_Sharing"]]


def test_a_thread_started_under_one_enable_runs_under_the_next():
    from twice.portable.dispatch import mode as portable

    go, done, seen = threading.Event(), threading.Event(), []

    def worker():
        while not done.is_set():
            if go.wait(0.05):
                go.clear()
                seen.append(_refuses_eig())

    portable.enable("strict")
    thread = threading.Thread(target=worker)
    thread.start()
    portable.disable()
    try:
        portable.enable("strict")
        go.set()
        while not seen:
            threading.Event().wait(0.01)
    finally:
        portable.disable()
        done.set()
        thread.join(10)
    assert seen == [True]


def test_deterministic_inside_an_enabled_thread_leaves_its_mode_in_place():
    """twice.deterministic(portable=True) in a thread that enabled the mode already neither
    enters it again nor leaves it on exit."""
    import twice
    from twice.portable.dispatch import mode as portable

    portable.enable("strict")
    try:
        with twice.deterministic(seed=0, mode="warn", portable=True):
            assert _refuses_eig()
        assert _refuses_eig() and portable.entered()
    finally:
        portable.disable()
    assert not portable.entered() and not _refuses_eig()
