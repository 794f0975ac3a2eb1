"""twice.testing, the public face of app/testing.py for users' test suites (the assertions
themselves: tests/unit/app/test_testing.py)."""

import pytest
import torch

import twice.testing
from twice.app import testing


def test_the_public_names_are_app_testings_own():
    for name in twice.testing.__all__:
        assert getattr(twice.testing, name) is getattr(testing, name), name


def test_a_function_that_never_steps_an_optimizer_is_told_so():
    with pytest.raises(AssertionError, match="no training step was recorded"):
        twice.testing.assert_reproducible(lambda: torch.nn.Linear(2, 1)(torch.ones(1, 2)))
