"""app/reportplots: one SVG panel per recorded metric, loss first, the same bytes for the same
runs, names from records shown as text."""

import pytest

from twice.app.reportplots import metric_panels, plot_text
from unit.app.folders import steps, write_run

pytest.importorskip("matplotlib")


def test_each_metric_gets_a_panel_loss_first_and_the_same_bytes_twice(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5, 1.25, 1.0]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5, 1.3, 1.1]))

    def panels():
        return metric_panels([a, b], ["a", "b $x$"], [2], [False, False], [4, 4])

    first = panels()
    assert [name for name, _ in first] == ["loss", "learning rate"]
    assert all(svg.startswith("<svg") for _, svg in first)
    assert panels() == first
    assert "b $x$" in first[0][1]  # a name is text, never mathtext


def test_a_name_from_a_record_is_shown_with_its_controls_escaped():
    assert plot_text("run\x1b[2J\n") == "run\\x1b[2J\n" and plot_text(3) == "3"
