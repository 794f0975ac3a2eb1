"""record/callsite: the user's line of an operation, the module paths of a model, and the
operands of the division written on a line."""

import os
import sys
import traceback

import torch

from twice.record.callsite import division_operands, line_from_traceback, module_names, user_line


def test_the_user_line_is_the_innermost_frame_outside_torch_and_twice():
    line = sys._getframe().f_lineno + 1
    where = user_line()
    assert where == f"{os.path.relpath(__file__)}:{line}"


def test_the_line_in_a_stored_traceback_is_the_users_innermost():
    def inner():
        return traceback.format_stack()

    stack = inner()
    line = inner.__code__.co_firstlineno + 1  # `return traceback.format_stack()`
    torch_frame = f'  File "{torch.__file__}", line 7, in f\n    pass\n'
    assert line_from_traceback(stack + [torch_frame]) == f"{os.path.relpath(__file__)}:{line}"
    assert line_from_traceback("".join(stack)) == f"{os.path.relpath(__file__)}:{line}"
    assert line_from_traceback(None) is None and line_from_traceback(torch_frame) is None


def test_each_live_module_is_named_by_its_path_from_the_outermost():
    inner = torch.nn.Sequential(torch.nn.Tanh())
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), inner)
    names = module_names()
    named = {module: names[id(module)] for module in (model, model[0], inner, inner[0])}
    assert [path for _, path in named.values()] == [
        "Sequential",
        "Sequential.0",
        "Sequential.1",
        "Sequential.1.0",
    ]
    assert all(ref() is module for module, (ref, _) in named.items())


def test_the_operands_of_the_one_division_on_a_line_are_read_as_written(tmp_path):
    source = tmp_path / "train.py"
    lines = [
        "g = p.grad / (p.grad.norm() + eps)",
        "p.grad /= total",
        "scaled = loss.div(steps)",
        "ratio = torch.div(a[0], b)",
        "both = a / b + c / d",
        "plain = a * b",
        "broken = (",
    ]
    source.write_text("\n".join(lines) + "\n")
    found = [division_operands(f"{source}:{n}") for n in range(1, len(lines) + 1)]
    assert found == [
        ("p.grad", "p.grad.norm() + eps"),
        ("p.grad", "total"),
        ("loss", "steps"),
        ("a[0]", "b"),
        None,  # two divisions: which one made 0/0 cannot be said
        None,
        None,
    ]
    assert division_operands(None) is None and division_operands(f"{source}:x") is None
    assert division_operands(f"{tmp_path / 'absent.py'}:1") is None
