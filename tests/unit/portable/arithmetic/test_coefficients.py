"""arithmetic/coefficients: one table of kernels and constants for the Python, C and Triton
paths."""

import math

import pytest


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
