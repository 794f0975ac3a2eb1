"""dispatch/operands: what the arguments hold, read before every kernel."""

import torch

from twice.portable.dispatch import operands


def test_flags_name_floating_half_and_filled_operands_in_lists_and_keywords():
    f, h, i = torch.ones(2), torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64)
    empty = torch.ones(0)
    assert operands.scan((i, 3.0), {}) == 0
    assert operands.scan((f,), {}) == operands.INEXACT | operands.VALUES
    assert operands.scan((empty,), {}) == operands.INEXACT  # no element: no VALUES
    assert operands.scan(([i, h],), {}) == operands.HALF | operands.VALUES
    assert operands.scan((i,), {"weight": empty, "out": f}) & operands.VALUES
    assert operands.has_complex(([f, torch.ones(1, dtype=torch.complex64)],), {})
    assert not operands.has_complex((f,), {"x": i})


def test_an_overload_takes_a_dtype_where_its_schema_says_so():
    assert operands.takes_dtype(torch.ops.aten.linspace.default)
    assert operands.takes_dtype(torch.ops.aten.sum.dim_IntList)
    assert not operands.takes_dtype(torch.ops.aten.add.Tensor)
