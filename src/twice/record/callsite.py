"""Where an operation was called: the user's source line, and each module's path in its model.

The line is the innermost frame outside torch, twice and the standard library; for backward ops,
the forward traceback anomaly mode stored. Module paths run from the outermost module
("Sequential.2", "encoder.layers.3.attn").
"""

from __future__ import annotations

import ast
import functools
import gc
import linecache
import os
import sys
import weakref
from typing import Any

import torch

__all__ = ["user_line", "line_from_traceback", "module_names", "division_operands"]
__all__ += ["running_module_and_line"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_TWICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the twice package
_STDLIB_DIR = os.path.dirname(os.__file__)


@functools.lru_cache(maxsize=4096)
def _relative(filename: str) -> str:
    return os.path.relpath(filename)  # a stat of the working directory each time: cached per file


_INTERNAL: dict[
    Any, bool
] = {}  # code object -> whether it lies in torch, twice or the standard library


def user_line() -> str | None:
    """`file:line` of the innermost frame outside torch, twice and the standard library."""
    frame = sys._getframe(1)
    internal = _INTERNAL
    while frame is not None:
        code = frame.f_code
        inside = internal.get(code)
        if inside is None:
            filename = code.co_filename
            inside = internal[code] = filename.startswith(
                (_TORCH_DIR, _TWICE_DIR, _STDLIB_DIR, "<")
            )
        if not inside:
            return f"{_relative(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def line_from_traceback(stack: str | None) -> str | None:
    """The user's line in a forward traceback stored by anomaly mode (for backward ops)."""
    if not stack:
        return None
    if isinstance(stack, list):
        stack = "".join(stack)
    user = None
    for line in stack.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            filename = line.split('"')[1]
            if not filename.startswith(
                (_TORCH_DIR, _TWICE_DIR, _STDLIB_DIR)
            ) and not filename.startswith("<"):
                number = line.split("line ")[1].split(",")[0]
                user = f"{_relative(filename)}:{number}"
    return user


def module_names() -> dict[int, tuple[Any, str]]:
    """Every live module's path from its outermost parent, by id, with a weak reference to the
    module (an id alone may later belong to another module: check the reference)."""
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.nn.Module)]
    parent: dict[int, tuple[Any, str]] = {}
    for module in modules:
        for name, child in module._modules.items():
            if child is not None:
                parent.setdefault(id(child), (module, name))
    names = {}
    for module in modules:
        parts, current, seen = [], module, set()
        while id(current) in parent and id(current) not in seen:
            seen.add(id(current))
            current, name = parent[id(current)]
            parts.append(name)
        root = type(current).__name__
        names[id(module)] = (
            weakref.ref(module),
            ".".join([root, *reversed(parts)]) if parts else root,
        )
    return names


def division_operands(where: str | None) -> tuple[str, str] | None:
    """The numerator and denominator, as written, of the one division on the source line `where`
    ("train.py:19", as user_line gives it): `a / b`, `a /= b`, `a.div(b)`, `a.div_(b)`,
    `torch.div(a, b)`. None when the line cannot be read or holds no division or several."""
    if not where or ":" not in where:
        return None
    filename, _, number = where.rpartition(":")
    if not number.isdigit():
        return None
    text = linecache.getline(os.path.abspath(filename), int(number)).strip()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found.append((node.left, node.right))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            found.append((node.target, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, args = node.func.attr, node.args
            if name in ("div", "div_", "true_divide") and len(args) == 2:  # torch.div(a, b)
                found.append((args[0], args[1]))
            elif name in ("div", "div_", "true_divide") and len(args) == 1:  # a.div_(b)
                found.append((node.func.value, args[0]))
    if len(found) != 1:
        return None
    return ast.unparse(found[0][0]), ast.unparse(found[0][1])


def running_module_and_line() -> tuple[str | None, str | None]:
    """The module whose forward is running (by its path) and the user's line, from the stack."""
    module = None
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if (
            module is None
            and isinstance(owner, torch.nn.Module)
            and frame.f_code.co_name == "forward"
        ):
            names = module_names()
            entry = names.get(id(owner))
            module = entry[1] if entry is not None else type(owner).__name__
        frame = frame.f_back
    return module, user_line()
