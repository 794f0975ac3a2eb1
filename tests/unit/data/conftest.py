"""The data layer's shared fixture."""

import pytest

import twice.data


@pytest.fixture
def python_loop(monkeypatch):
    """The loader's Python loop, as where twice._native was not built (epoch tables are its own)."""
    monkeypatch.setattr(twice.data.samples, "native", None)
