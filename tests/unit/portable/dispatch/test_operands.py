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
    assert operands.unusual(([f, torch.ones(1, dtype=torch.complex64)],), {}) == operands.COMPLEX_T
    assert not operands.unusual((f,), {"x": i})


def test_sparse_operands_are_flagged_and_uncoalesced_ones_named_loose():
    """A sparse tensor among a kernel's operands is SPARSE (whatever its layout); a COO one that
    is not coalesced is LOOSE for the exact route (it may hold one position twice)."""
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    coalesced = dense.to_sparse()
    loose = torch.sparse_coo_tensor([[0, 0], [1, 1]], [1.0, 2.0], (2, 2))
    assert not loose.is_coalesced()
    for layout_form in (coalesced, loose, dense.to_sparse_csr()):
        assert operands.scan((layout_form,), {}) & operands.SPARSE
    assert not operands.scan((dense,), {}) & operands.SPARSE
    assert operands.unusual(([dense, loose],), {}) == operands.LOOSE
    assert not operands.unusual((coalesced, dense.to_sparse_csr()), {})


def test_an_overload_takes_a_dtype_where_its_schema_says_so():
    assert operands.takes_dtype(torch.ops.aten.linspace.default)
    assert operands.takes_dtype(torch.ops.aten.sum.dim_IntList)
    assert not operands.takes_dtype(torch.ops.aten.add.Tensor)


def test_integer_operands_are_promoted_to_the_floating_results_dtype():
    ints, flags = torch.arange(3), torch.tensor([True, False, True])
    result = torch.ones(3, dtype=torch.float64)
    op = torch.ops.aten.atan2.default
    args, kwargs = operands.promoted(op, (ints, [flags, 2]), {"other": ints}, (result, ints))
    assert args[0].dtype == torch.float64 and args[1][0].dtype == torch.float64
    assert args[1][1] == 2 and kwargs["other"].dtype == torch.float64
    assert operands.promoted(op, (3, 4.0), {}, result) is None  # Python numbers alone
    bincount = torch.ops.aten.bincount.default
    assert operands.promoted(bincount, (ints, ints), {}, result) is None  # exact integer sums
