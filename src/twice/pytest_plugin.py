"""twice's pytest plugin (registered through pytest's entry point, so it loads in every pytest
session of an environment that has twice): the `--twice-update-golden` option and its fixture.
It imports nothing of twice's own, nor NumPy or torch: the assertions live in twice.testing and
load when a test imports them."""

from __future__ import annotations

import pytest

__all__ = ["pytest_addoption", "twice_update_golden"]


def pytest_addoption(parser) -> None:
    """The plugin's option: `--twice-update-golden` rewrites golden traces instead of comparing."""
    parser.addoption(
        "--twice-update-golden",
        action="store_true",
        default=False,
        help="twice: rewrite golden traces instead of comparing with them",
    )


@pytest.fixture
def twice_update_golden(request) -> bool:
    """True when pytest runs with --twice-update-golden."""
    return bool(request.config.getoption("--twice-update-golden"))
