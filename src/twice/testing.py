"""Reproducibility assertions for your own test suite (and, through pytest's entry point, a plugin).

from twice.testing import assert_reproducible
assert_reproducible(lambda: train(steps=5))
"""

from twice.app.testing import (
    assert_bitwise_resume,
    assert_matches_golden,
    assert_reproducible,
    record_trace,
)

__all__ = ["assert_reproducible", "assert_matches_golden", "assert_bitwise_resume", "record_trace"]
