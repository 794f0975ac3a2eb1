"""when_imported: a callback right after a module finishes importing, or at once if it has."""

import json
import sys

from twice.runtime.imports import when_imported


def test_the_callback_runs_once_the_module_has_run_whole(tmp_path, monkeypatch):
    (tmp_path / "late_module_for_twice.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_module_for_twice", raising=False)
    seen = []
    when_imported("late_module_for_twice", lambda module: seen.append(module.VALUE))
    assert seen == []
    try:
        import late_module_for_twice  # noqa: F401
    finally:
        sys.modules.pop("late_module_for_twice", None)
    assert seen == [42]
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)  # removed: once


def test_a_module_imported_already_gets_its_callback_at_once():
    seen = []
    when_imported("json", seen.append)
    assert seen == [json]
