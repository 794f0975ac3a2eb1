"""What an ATen operation was given: its tensors, and its Python numbers (a learning rate, an
alpha), found in its arguments as the dispatcher passes them."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["op_scalars", "op_tensors"]


def op_scalars(args: tuple, kwargs: dict) -> list[str]:
    """The op's Python-number arguments as text (floats exactly, in hex), in order."""
    values = list(args) + list(kwargs.values()) if kwargs else args
    return [
        value.hex() if type(value) is float else str(value)
        for value in values
        if type(value) in (float, int, bool)
    ]


def op_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in `value` (an op's arguments or results), nested lists and dicts included."""
    tensor_type = torch.Tensor
    if isinstance(value, tensor_type):
        return [value]  # most ops return one tensor
    if type(value) is tuple and all(
        type(item) is not list and type(item) is not tuple and type(item) is not dict
        for item in value
    ):
        return [
            item for item in value if isinstance(item, tensor_type)
        ]  # the usual flat case, in one pass
    out: list[torch.Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return out
