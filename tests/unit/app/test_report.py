"""app/report: one self-contained HTML page on runs (each compared with the first), the same bytes
for the same runs."""

import pytest

from twice.app.report import build_report, write_report
from twice.core.errors import UsageError
from unit.app.folders import steps, write_run

pytest.importorskip("matplotlib")


def test_a_report_leads_with_the_verdict_runs_no_script_and_is_the_same_bytes_twice(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5, 1.25, 1.0]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5, 1.3, 1.1]))
    page = build_report([a, b])
    assert page.startswith("<!DOCTYPE html>") or page.startswith("<!doctype html>")
    assert "runs differ: first divergence at step 2" in page
    assert "<script" not in page and "default-src 'none'" in page  # self-contained, inert
    assert "<svg" in page
    written = write_report([a, b], tmp_path / "report.html")
    assert written.read_text(encoding="utf-8") == page  # the same runs, the same bytes


def test_nothing_to_report_on_is_a_usage_error():
    with pytest.raises(UsageError, match="nothing to report on"):
        build_report([])
