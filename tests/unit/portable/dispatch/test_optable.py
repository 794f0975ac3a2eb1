"""The op table (docs/portable-ops.md) is the code's: regenerated in a process of its own it is the
committed file byte for byte, and one row answers "where is X's kernel"."""

from __future__ import annotations

import difflib
import subprocess
import sys

import pytest
from conftest import clean_env

from twice.portable.dispatch import optable, table


@pytest.fixture(scope="module")
def rows():
    return optable.rows()  # without OpInfo names: importing op_db changes global flags


def _row(rows, overload):
    return next(r for r in rows if overload in r.overloads)


def test_the_committed_table_is_what_the_code_generates(tmp_path):
    fresh = tmp_path / "portable-ops.md"
    done = subprocess.run(
        [sys.executable, "-m", "twice.portable.dispatch.optable", str(fresh)],
        capture_output=True, text=True, env=clean_env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    committed = optable.DOC.read_text() if optable.DOC.exists() else ""
    if fresh.read_text() != committed:
        diff = difflib.unified_diff(
            committed.splitlines(),
            fresh.read_text().splitlines(),
            "committed",
            "code",
            n=0,
            lineterm="",
        )
        shown = "\n".join(list(diff)[:12])
        pytest.fail(f"docs/portable-ops.md differs from the code: run `{optable.COMMAND}`\n{shown}")


def test_one_row_answers_where_a_kernel_is(rows):
    conv = _row(rows, "convolution_backward.default")
    assert conv.route == "kernel" and "ops.conv.convolution_backward" in conv.function
    assert "`p_conv_weight_grad`" in conv.compiled and "unit/portable/" in conv.tests
    adam = _row(rows, "_fused_adam_.default")
    assert "ops.optim._fused_adam" in adam.function and "`p_compound` through" in adam.compiled
    lstm = _row(rows, "torch._VF.lstm")
    assert "ops.recurrent.layers" in lstm.function and "`p_lstm_step`" in lstm.compiled
    assert "`p_lstm_step`" not in _row(rows, "torch._VF.gru").compiled  # each cell its own


def test_every_kernel_and_replaced_layer_has_a_row(rows):
    listed = {o for r in rows for o in r.overloads}
    assert set(table.KERNELS) <= listed
    from twice.portable.ops import recurrent

    assert {f"torch._VF.{kind}" for kind in recurrent._KINDS} <= listed
    assert all(r.route == "kernel" for r in rows if set(r.overloads) & set(table.KERNELS))


def test_every_entry_point_the_table_names_is_bound_by_a_c_file_and_built(rows):
    named = {
        word.strip("`,;")
        for r in rows
        for word in r.compiled.split()
        if word.strip("`,;").startswith("p_")
    }
    assert {"p_conv_forward", "p_conv_weight_grad", "p_split", "p_unary", "p_lstm_step"} <= named
    points = {name: (defined, called) for name, defined, called in optable.entry_point_rows()}
    assert all(points[name][0].endswith(".c") and points[name][1] for name in named), named
    try:
        from twice import _native
    except ImportError:  # built without a C compiler: the sources above are what a build binds
        return
    assert all(hasattr(_native, name) for name in points), sorted(points)
