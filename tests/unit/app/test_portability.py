"""app/portability (`twice audit --portable`): Core ATen's coverage op by op, and what the audit
prints of what a run used that portable mode does not cover."""

from pathlib import Path

from twice.app.portability import (
    PortableAudit,
    core_coverage,
    format_core_coverage,
    format_portable_audit,
)

ROOT = Path(__file__).resolve().parents[3]


# What stays uncovered, each named in docs/portable.md with why: nothing since the FFTs.
UNCOVERED_CORE: set[str] = set()


def test_the_core_opset_is_covered_op_by_op_but_for_what_the_docs_name():
    found = core_coverage()
    assert len(found["ops"]) >= 180  # 189 overloads in torch 2.13
    uncovered = {e["op"] for e in found["ops"] if e["how"] == "uncovered"}
    assert uncovered == UNCOVERED_CORE
    docs = (ROOT / "docs" / "portable.md").read_text()
    assert all(op.split("::")[1].split(".")[0] in docs for op in uncovered)


def test_the_coverage_table_ends_with_its_totals():
    found = {
        "torch": "2.13.0",
        "ops": [
            {"op": "aten::mm.default", "how": "kernel", "detail": "kernel mm"},
            {"op": "aten::view.default", "how": "exact", "detail": "exact by schema"},
            {"op": "aten::_fft_r2c.default", "how": "uncovered", "detail": "uncovered"},
        ],
        "counts": {"kernel": 1, "exact": 1, "uncovered": 1},
    }
    lines = format_core_coverage(found).splitlines()
    assert lines[0] == "aten::mm.default        kernel mm"
    assert lines[-1].startswith(
        "2 of the 3 Core ATen overloads of torch 2.13.0 are covered (1 exact, 1 kernel, "
        "1 uncovered)"
    )


def test_the_audit_says_what_is_not_covered_where_or_that_everything_is():
    clean = PortableAudit(uncovered=[], steps=1, run_dir="runs/a", exit_code=0)
    assert format_portable_audit(clean).startswith(
        "every operation of the first 1 step is covered by portable mode"
    )
    entry = {"op": "aten::_fft_r2c.default", "count": 2, "module": "Net", "line": "train.py:9"}
    found = PortableAudit(uncovered=[entry], steps=3, run_dir="runs/b", exit_code=0)
    found.compiled_eagerly = 1
    text = format_portable_audit(found).splitlines()
    assert text[0] == (
        "1 operation of the first 3 steps is not covered by portable mode "
        "(their bits may depend on the machine):"
    )
    assert text[1] == "  aten::_fft_r2c.default in Net at train.py:9, 2 calls"
    assert text[-1].startswith("torch.compile: 1 compiled function ran eagerly")
    assert found.to_json()["command_exit_code"] == 0 and found.to_json()["run"] == "runs/b"


def test_an_audit_without_a_step_count_speaks_of_the_run():
    found = PortableAudit([], None, "runs/x", 0, 0)
    assert format_portable_audit(found).startswith("every operation of the run is covered")
    found = PortableAudit([{"op": "aten::x", "count": 2}], None, "runs/x", 0, 0)
    assert format_portable_audit(found).startswith("1 operation of the run is not covered")
