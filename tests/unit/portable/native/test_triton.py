"""native/triton: the Triton kernels for CUDA tensors give the fallbacks' bits, tried on CPU
tensors under Triton's interpreter (in a process of its own: the interpreter is chosen
when Triton is imported)."""

import importlib.util
import os
import subprocess
import sys

import pytest

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
from twice.portable.arithmetic.ordered import ordered_loop
from twice.portable.native import products
for a_shape, b_shape in [((3, 5), (5, 7)), ((2, 1, 40, 30), (3, 30, 35)), ((33, 1), (1, 2))]:
    a = torch.randn(*a_shape, generator=g, dtype=torch.float64)
    b = torch.randn(*b_shape, generator=g, dtype=torch.float64).mT.contiguous().mT
    a.view(-1)[:len(specials)] = torch.tensor(specials, dtype=torch.float64)[:a.numel()]
    ours = products.gpu_ordered_mm(a, b)
    theirs = ordered_loop(a, b)
    assert torch.equal(ours.isnan(), theirs.isnan()), a_shape
    assert torch.equal(torch.nan_to_num(ours, 7.0), torch.nan_to_num(theirs, 7.0)), a_shape
    assert torch.equal(ours.signbit() & ~ours.isnan(), theirs.signbit() & ~theirs.isnan())
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


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_each_triton_kernel_has_its_compiled_twins_code():
    from twice.portable.arithmetic import coefficients
    from twice.portable.native import triton as kernels

    assert kernels.FUNCTIONS  # the Triton kernels read their coefficients by these codes
    for name, code in kernels.FUNCTIONS.items():
        assert coefficients.UNARY_KERNELS.index(name) == code, name
