"""The op table's text: a kernel's name as the table spells it, and the page made from rows."""

from __future__ import annotations

from twice.portable.dispatch import table
from twice.portable.dispatch.optable import Row
from twice.portable.dispatch.optext import describe, render


def test_a_wrapper_is_named_with_what_it_wraps():
    assert describe(table.KERNELS["exp.default"]) == "ops.math.unary(arithmetic.elementwise.exp)"
    assert describe(table.KERNELS["mm.default"]) == "ops.products._mm"


def test_the_page_has_a_section_per_family_and_the_entry_points():
    rows = [
        Row("ops/products.py", ("mm.default",), "kernel", "`ops.products._mm`", "`p_split`",
            "the same function's torch operations", "—"),
        Row("exact", ("clone.default",), "exact: table.EXACT", "torch's own", "—", "—", "a | b"),
    ]  # fmt: skip
    page = render(rows, [("p_split", "portable/native/csrc/exact.c", "native.split_given")])
    assert page.index("## Kernels: `ops/products.py`") < page.index("## Exact by rule")
    assert "| `mm.default` | kernel | `ops.products._mm` | `p_split` |" in page
    assert "a \\| b" in page  # a bar inside a cell does not end it
    assert "| `p_split` | `portable/native/csrc/exact.c` | `native.split_given` | 1 |" in page
