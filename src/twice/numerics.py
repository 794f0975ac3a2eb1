"""Numerical health in Python: `with twice.numerics.watch(mode="stop"): train()` finds where a
NaN starts."""

from twice.record.numerics import NonFiniteError, NumericsWatch, watch

__all__ = ["watch", "NumericsWatch", "NonFiniteError"]
