"""The store's shared fixture: a trace read through twice._native and through Python."""

import pytest

from twice.core import digests


@pytest.fixture(params=["native", "python"])
def walk(request, monkeypatch):
    """Each test twice: with the compiled walk, and with the Python one."""
    if request.param == "native":
        if digests.native is None:
            pytest.skip("twice._native is not built here")
    else:
        monkeypatch.setattr(digests, "native", None)
    return request.param
