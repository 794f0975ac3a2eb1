"""native (twice/portable/native/__init__.py): the compiled kernels' bindings, called by
name, and their scratch memory."""

import platform
from pathlib import Path

import pytest
import torch

from twice.portable import native


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
