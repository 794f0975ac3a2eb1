"""dispatch/detours: torch.nn.functional's deterministic-GPU decompositions run the operation
itself in a thread under portable mode, so interpolation, 3-d max pooling and replicate padding
give one set of bits on every device; and an inventory of torch.nn's Python that fails when
torch adds a route chosen by a flag the mode does not pin."""

import ast
import importlib
import inspect
import pkgutil
import threading

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules
from hypothesis import given
from hypothesis import strategies as st

from twice.portable.dispatch import detours, switches
from twice.portable.dispatch.mode import PortableMode
from unit.portable.bits import EXAMPLES, gen, same_bits

DECOMPOSITIONS = importlib.import_module("torch._decomp.decompositions")


def _calls(case):
    """(input, the operation as F calls it on a CPU, the decomposition as F calls it on a GPU
    with deterministic algorithms on: looked up on the module at call time, as F does)."""
    g = gen(case["seed"])
    kind, dims = case["kind"], case["dims"]
    x = torch.randn(2, 3, *[case["size"] + i for i in range(dims)], generator=g)
    x = x.to(case["dtype"])
    if kind == "linear":
        names = {1: "upsample_linear1d", 2: "upsample_bilinear2d", 3: "upsample_trilinear3d"}
        out = [case["size"] * 2 + 1 + i for i in range(dims)]
        size, scales = (None, [1.7] * dims) if case["by_scale"] else (out, None)
        ac = case["align_corners"]
        op = getattr(torch._C._nn, names[dims])
        return (
            x,
            (lambda t: op(t, size, ac, scales)),
            (lambda t: DECOMPOSITIONS._upsample_linear_vec(t, size, ac, scales)),
        )
    if kind == "replicate":
        pad = [1, 2, 0, 3, 2, 1][: 2 * dims]
        return (
            x,
            (lambda t: F.pad(t, pad, "replicate")),
            (lambda t: DECOMPOSITIONS._replication_pad(t, pad)),
        )
    x = torch.randn(2, 3, *[case["size"] + 2 + i for i in range(3)], generator=g)
    x = x.to(case["dtype"])
    pool = ([2, 2, 2], [1, 2, 1], [1, 0, 1], [1, 1, 1], case["align_corners"])
    return (
        x,
        (lambda t: torch._C._nn.max_pool3d_with_indices(t, *pool)[0]),
        (lambda t: DECOMPOSITIONS.max_pool3d_with_indices(t, *pool)[0]),
    )


CASES = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["linear", "replicate", "max_pool3d"]),
        "dims": st.integers(1, 3),
        "size": st.integers(2, 6),
        "by_scale": st.booleans(),
        "align_corners": st.booleans(),
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "seed": st.integers(0, 2**16),
    }
)


def _forward_backward(fn, x, seed):
    x = x.clone().requires_grad_()
    with PortableMode("strict") as mode:
        out = fn(x)
        grad = torch.randn(out.shape, generator=gen(seed)).to(out.dtype)
        (dx,) = torch.autograd.grad(out, x, grad)
    assert not mode.uncovered
    return out, dx


@EXAMPLES
@given(CASES)
def test_the_gpu_decomposition_gives_the_operations_bits_under_the_mode(case):
    """Without the detour the decomposition rounds otherwise: bilinear's lerps, forward and
    backward, and replicate padding's backward summed by index_put."""
    x, operation, decomposition = _calls(case)
    for a, b in zip(
        _forward_backward(operation, x, case["seed"]),
        _forward_backward(decomposition, x, case["seed"]),
    ):
        assert same_bits(a, b)


def test_a_thread_outside_the_mode_runs_torchs_decomposition():
    x = torch.randn(1, 2, 5, 6)
    original = DECOMPOSITIONS._upsample_linear_vec
    seen = {}

    def other():
        seen["out"] = DECOMPOSITIONS._upsample_linear_vec(x, [9, 11], False, None)

    with PortableMode("strict"):
        assert DECOMPOSITIONS._upsample_linear_vec.__wrapped__ is original
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert DECOMPOSITIONS._upsample_linear_vec is original  # put back by the last mode
    assert same_bits(seen["out"], original(x, [9, 11], False, None))


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _torch_nn_modules():
    names = [m.name for m in pkgutil.iter_modules(torch.nn.modules.__path__)]
    return [F, *(importlib.import_module(f"torch.nn.modules.{name}") for name in names)]


def test_every_deterministic_branch_of_torch_nn_is_a_detour():
    """A branch of torch.nn's Python on `are_deterministic_algorithms_enabled()` takes another
    route on a GPU: each must call a decomposition detours.py sends back to its operation, and
    each detour must still be one torch takes."""
    taken = set()
    for module in _torch_nn_modules():
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if not isinstance(node, ast.If):
                continue
            tests = {_dotted(n.func) for n in ast.walk(node.test) if isinstance(n, ast.Call)}
            if "torch.are_deterministic_algorithms_enabled" not in tests:
                continue
            called = {
                n.attr
                for statement in node.body
                for n in ast.walk(statement)
                if isinstance(n, ast.Attribute) and n.attr in dir(DECOMPOSITIONS)
            }
            where = f"{module.__name__}, line {node.lineno}"
            assert called, f"a deterministic branch with no decomposition at {where}"
            detoured = {name for module_name, name in detours.DETOURS if "_decomp" in module_name}
            assert called <= detoured, f"{called - detoured} at {where}"
            taken |= called
    assert taken == detoured - {"native_batch_norm_helper"}  # (a decomposition's own helper)


# torch.backends settings read by torch.nn's Python, each pinned by the mode (switches.SETTINGS)
PINNED = {
    "torch.backends.cudnn": "torch.backends.cudnn.enabled",
    "torch.backends.mha": "torch.backends.mha fast path",
}


def test_every_backend_setting_torch_nn_reads_is_pinned_by_the_mode():
    read = set()
    for module in _torch_nn_modules():
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            name = _dotted(node) if isinstance(node, ast.Attribute) else None
            if name and name.startswith("torch.backends."):
                read.add(".".join(name.split(".")[:3]))
    assert read <= set(PINNED), f"torch.nn reads {read - set(PINNED)}: pin it in switches.py"
    pinned = {setting.name for setting in switches.SETTINGS}
    assert set(PINNED.values()) <= pinned


def _optimizers():
    optim = torch.optim
    return [
        (optim.Adam, {"amsgrad": True, "weight_decay": 0.1}),
        (optim.AdamW, {}),
        (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (optim.RMSprop, {"momentum": 0.5, "centered": True}),
        (optim.Adagrad, {"lr_decay": 0.01}),
        (optim.Adamax, {"weight_decay": 0.1}),
        (optim.NAdam, {"weight_decay": 0.1}),  # coupled decay: its two forms round otherwise
        (optim.RAdam, {"weight_decay": 0.1, "decoupled_weight_decay": True}),
        (optim.Adadelta, {"weight_decay": 0.1}),
        (optim.ASGD, {"weight_decay": 0.1, "t0": 1}),  # its two forms round otherwise
        (optim.Rprop, {}),
    ]


def _train(cls, kwargs, foreach):
    g = gen(3)
    params = [torch.randn(5, 4, generator=g, requires_grad=True), torch.randn(7, generator=g)]
    params[1].requires_grad_()
    optimizer = cls(params, foreach=foreach, **kwargs)
    with PortableMode("strict"):
        for _ in range(3):
            loss = sum((p * p).sum() for p in params) + params[0].sin().sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return [p.detach() for p in params]


def test_an_optimizer_left_to_choose_runs_its_single_tensor_form_on_every_device(monkeypatch):
    """On a GPU torch picks the multi-tensor form where `foreach` is not given; here a CPU is
    made to look like one (torch's list of devices with foreach kernels), and under the mode the
    bits are still the single-tensor form's."""
    import torch.optim.optimizer as optimizer_module

    monkeypatch.setattr(
        optimizer_module, "_get_foreach_kernels_supported_devices", lambda: ["cpu", "cuda"]
    )
    for cls, kwargs in _optimizers():
        single = _train(cls, kwargs, False)
        chosen = _train(cls, kwargs, None)
        assert all(same_bits(a, b) for a, b in zip(single, chosen)), cls.__name__


# torch's functions that choose a multi-tensor or fused form by device
CHOOSERS = {
    "_default_to_fused_or_foreach",
    "_get_foreach_kernels_supported_devices",
    "_get_fused_kernels_supported_devices",
}  # (clip_grad's _has_foreach_support counts a CPU as a foreach device: one form everywhere)


def test_every_choice_by_device_in_torch_optim_and_nn_utils_is_a_detour():
    """Each module of torch.optim and torch.nn.utils that calls a function choosing a form by
    device calls it through a detour (optimizer.py only defines them; `fused=True`'s check
    validates a form the program named)."""
    import torch.nn.utils
    import torch.optim

    choosing = set()
    for package in (torch.optim, torch.nn.utils):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if module.__name__ == "torch.optim.optimizer":
                continue
            for n in ast.walk(ast.parse(inspect.getsource(module))):
                if isinstance(n, ast.Call) and _dotted(n.func) in CHOOSERS:
                    choosing.add((module.__name__, _dotted(n.func)))
    detoured = {key for key in detours.DETOURS if key[1] in CHOOSERS}
    assert choosing and choosing == detoured


def _seeded(fn, seed):
    def run(t):
        torch.manual_seed(seed)
        return fn(t)

    return run


DROPOUT = st.fixed_dictionaries(
    {
        "p": st.sampled_from([0.04, 0.1, 0.15, 0.42, 0.5, 0.87, 0.97]),
        "dtype": st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
        "shape": st.sampled_from([(7,), (4, 33), (2, 3, 5)]),
        "seed": st.integers(0, 2**16),
    }
)


@EXAMPLES
@given(DROPOUT)
def test_dropout_takes_the_gpus_operation_on_every_device(case):
    """A CPU's dropout is `bernoulli_`, `div_`, `mul` (a scale of 1/float32(1-p)); a GPU's is
    `native_dropout` (1/(1-p) rounded once). Under the mode F.dropout is the latter here too."""
    x = torch.randn(case["shape"], generator=gen(case["seed"])).to(case["dtype"])
    p = case["p"]
    dropout = _seeded(lambda t: F.dropout(t, p, training=True), case["seed"])
    native = _seeded(lambda t: torch.native_dropout(t, p, True)[0], case["seed"])
    for a, b in zip(_forward_backward(dropout, x, 1), _forward_backward(native, x, 1)):
        assert same_bits(a, b)


RMS = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
        "shape": st.sampled_from([((4, 6), [6]), ((2, 3, 96), [96]), ((2, 3, 40), [3, 40])]),
        "weight": st.booleans(),
        "eps": st.sampled_from([None, 1e-5, 1e-2]),
        "seed": st.integers(0, 2**16),
    }
)


@EXAMPLES
@given(RMS)
def test_rms_norm_runs_the_cpus_operations_on_every_device(case):
    """torch's rms_norm differentiates its operations one by one on a CPU and runs
    `_fused_rms_norm` with its own backward on a GPU. Here torch.rms_norm is made to act as on
    a GPU (the fused operation's decompositions, forward and backward, as the mode runs them
    there): under the mode F.rms_norm still gives the CPU's bits, computed beforehand."""
    shape, normalized = case["shape"]
    g = gen(case["seed"])
    x = (torch.randn(shape, generator=g) * 3).to(case["dtype"])
    w = torch.randn(normalized, generator=g).to(case["dtype"]) if case["weight"] else None
    eps = case["eps"]
    grad = torch.randn(shape, generator=g).to(case["dtype"])

    def run():
        inputs = [t.clone().requires_grad_() for t in (x, w) if t is not None]
        with PortableMode("strict") as mode:
            out = F.rms_norm(inputs[0], normalized, *inputs[1:], eps=eps)
            grads = torch.autograd.grad(out, inputs, grad)
        assert not mode.uncovered
        return [out, *grads]

    cpu = run()

    class AsOnAGpu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, normalized_shape, weight, eps):
            out, rstd = DECOMPOSITIONS._fused_rms_norm(x, normalized_shape, weight, eps)
            ctx.save_for_backward(x, rstd, weight)
            ctx.shape = normalized_shape
            return out

        @staticmethod
        def backward(ctx, grad):
            x, rstd, weight = ctx.saved_tensors
            mask = [True, weight is not None]
            gx, gw = DECOMPOSITIONS._fused_rms_norm_backward(grad, x, ctx.shape, rstd, weight, mask)
            return gx, None, gw, None

    original = torch.rms_norm
    torch.rms_norm = lambda x, shape, weight=None, eps=None: AsOnAGpu.apply(
        x, list(shape), weight, eps
    )
    try:
        gpu = run()
    finally:
        torch.rms_norm = original
    assert all(same_bits(a, b) for a, b in zip(cpu, gpu))


def test_rms_norm_under_the_mode_has_second_derivatives_and_torchs_errors():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    with PortableMode("strict"):
        assert torch.autograd.gradgradcheck(lambda x, w: F.rms_norm(x, [5], w), (x, w))
        with pytest.raises(RuntimeError, match="normalized_shape"):
            F.rms_norm(x, [4])


def test_averaged_model_takes_one_form_on_every_device(monkeypatch):
    """AveragedModel averages with `_foreach_lerp_`-style updates on a device with foreach
    kernels and one tensor at a time elsewhere, and the two round otherwise; here a CPU is made
    to look like a GPU (torch's list of such devices) and the bits stay the CPU's."""
    from torch.optim import swa_utils

    def averaged(looks_like_gpu):
        if looks_like_gpu:
            monkeypatch.setattr(
                swa_utils, "_get_foreach_kernels_supported_devices", lambda: ["cpu", "cuda"]
            )
        g = gen(5)
        torch.manual_seed(0)
        model = torch.nn.Linear(40, 100)
        average = swa_utils.AveragedModel(model)
        with PortableMode("strict"):
            for _ in range(4):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn(p.shape, generator=g))
                average.update_parameters(model)
        monkeypatch.undo()
        return [p.detach().clone() for p in average.parameters()]

    assert all(same_bits(a, b) for a, b in zip(averaged(False), averaged(True)))


def test_einsum_contracts_left_to_right_even_if_opt_einsum_is_turned_on_again():
    g = gen(7)
    a, b, c = (
        torch.randn(40, 3, generator=g),
        torch.randn(3, 40, generator=g),
        torch.randn(40, 2, generator=g),
    )
    with PortableMode("strict"):
        reference = torch.einsum("ij,jk,kl->il", a, b, c)
        before = torch.backends.opt_einsum.enabled
        torch.backends.opt_einsum.enabled = True  # a program's own line, after twice's
        try:
            again = torch.einsum("ij,jk,kl->il", a, b, c)
        finally:
            torch.backends.opt_einsum.enabled = before
        left_to_right = (a @ b) @ c
    assert same_bits(reference, again) and same_bits(again, left_to_right)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_every_caller_of_dropout_takes_native_dropout_under_the_mode():
    """torch's C++ calls `aten::dropout` from attention's math route, the transformer layers
    and a stacked RNN; the mode's kernel for it serves them all, so none draws `bernoulli_`."""
    x = torch.randn(2, 3, 5, 8)
    lstm = torch.nn.LSTM(8, 8, num_layers=2, dropout=0.3)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, batch_first=True)
    calls = {
        "F.dropout": lambda: F.dropout(x, 0.3),
        "attention": lambda: F.scaled_dot_product_attention(x, x, x, dropout_p=0.3),
        "stacked LSTM": lambda: lstm(x[0]),
        "transformer layer": lambda: layer(x[0]),
    }
    for name, call in calls.items():
        with PortableMode("strict"), _Ops() as ops:
            call()
        assert "native_dropout" in ops.seen and "bernoulli_" not in ops.seen, name


def test_a_thread_outside_the_mode_gets_torchs_dropout_meanwhile():
    """The kernel is registered for the process while the mode is active; a thread outside it
    gets torch's own operations and bits."""
    x = torch.randn(4, 64)
    torch.manual_seed(3)
    plain = F.dropout(x, 0.15)
    seen = {}

    def other():
        torch.manual_seed(3)
        with _Ops() as ops:
            seen["out"] = F.dropout(x, 0.15)
        seen["ops"] = ops.seen

    mode = PortableMode("strict")  # entered here alone: a thread started meanwhile has none
    mode.__enter__()
    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    finally:
        mode.__exit__(None, None, None)
    assert same_bits(seen["out"], plain) and "bernoulli_" in seen["ops"]


def test_batch_norms_decomposition_gives_every_device_the_cpus_statistics():
    """torch's helper keeps the saved statistics in float32 off a CPU (and the running ones in
    evaluation) and casts them to a half-precision input's dtype on a CPU. The meta device,
    not a CPU, stands in for a GPU: the detour's results have the CPU's dtypes and shapes."""
    helper = DECOMPOSITIONS.native_batch_norm_helper
    for training in (True, False):
        shapes = {}
        for device in ("cpu", "meta"):
            x = torch.randn(4, 3, 5).to(torch.bfloat16).to(device)
            stats = [torch.zeros(3, device=device), torch.ones(3, device=device)]
            out = detours._batch_norm_as_on_a_cpu(
                helper, x, None, None, *stats, training, 0.1, 1e-5, True
            )
            shapes[device] = [(t.dtype, tuple(t.shape)) for t in out[:3]]
        assert shapes["cpu"] == shapes["meta"], training
        plain = helper(x, None, None, *stats, training, 0.1, 1e-5, True)  # (meta, torch's own)
        assert [(t.dtype, tuple(t.shape)) for t in plain[:3]] != shapes["cpu"], training
