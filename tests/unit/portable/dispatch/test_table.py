"""dispatch/table: the kernels' registry by aten overload name, and what torch already computes
exactly (left to torch)."""

from twice.portable.dispatch import table


def test_kernels_are_registered_under_each_overload_name():
    @table.kernel("twice_test_op.default", "twice_test_op.out")
    def doubled(x):
        return x * 2

    try:
        assert table.KERNELS["twice_test_op.default"] is doubled
        assert table.KERNELS["twice_test_op.out"] is doubled
    finally:
        del table.KERNELS["twice_test_op.default"], table.KERNELS["twice_test_op.out"]


def test_what_rounds_more_than_once_is_never_exact_by_the_table():
    import twice.portable.dispatch.mode  # noqa: F401 - the kernel families register as it loads

    assert {"mul", "div", "clone", "index_select", "amax", "relu"} <= table.EXACT
    for name in ("sum", "mm", "addmm", "exp", "sqrt", "mean", "cumsum", "softmax"):
        assert name not in table.EXACT, name  # sums, products and functions: kernels
    assert "sum.default" in table.KERNELS and "mm.default" in table.KERNELS
    assert table.COMPLEX_EXACT - table.EXACT <= {
        "_conj", "_conj_physical", "_neg_view", "conj_physical", "imag", "real", "resolve_conj",
        "resolve_neg", "view_as_complex", "view_as_real",
    }  # fmt: skip
    assert "mul" not in table.COMPLEX_EXACT  # a complex product adds two products
    assert "scatter.reduce" in table.NOT_EXACT and "scatter" in table.EXACT
