"""dispatch/detours: torch.nn.functional's deterministic-GPU decompositions run the operation
itself in a thread under portable mode, so interpolation, 3-d max pooling and replicate padding
give one set of bits on every device; and an inventory of torch.nn's Python that fails when
torch adds a route chosen by a flag the mode does not pin."""

import ast
import importlib
import inspect
import pkgutil
import threading

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
    assert taken == detoured


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


def test_every_optimizer_that_chooses_by_device_is_a_detour():
    """Each torch.optim module that calls `_default_to_fused_or_foreach` is detoured."""
    import torch.optim

    choosing = set()
    for info in pkgutil.iter_modules(torch.optim.__path__):
        module = importlib.import_module(f"torch.optim.{info.name}")
        if info.name == "optimizer" or not hasattr(module, "__file__"):
            continue
        calls = {
            _dotted(n.func)
            for n in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(n, ast.Call)
        }
        if "_default_to_fused_or_foreach" in calls:
            choosing.add((module.__name__, "_default_to_fused_or_foreach"))
    assert choosing and choosing == {key for key in detours.DETOURS if "optim" in key[0]}
