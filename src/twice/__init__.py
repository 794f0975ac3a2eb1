"""twice: run PyTorch training twice and get the same bits; when you don't, learn where and why.

The public surface is `__all__`; attributes load on first use so that importing twice (which the
`twice run` bootstrap does in every process) costs almost nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "seed_everything": "rng.seeding",
    "deterministic": "runtime.determinism",
    "DeterminismReport": "runtime.determinism",
    "derive_seed": "core.seeds",
    "digest": "core.digests",
    "Run": "app.run",
    "TwiceError": "core.errors",
    "DeterminismError": "core.errors",
    "StepRecord": "core.records",
    "read_trace": "store.traces",
    "first_divergence": "core.divergence",
    "compare_runs": "app.compare",
    "checkpoint_dir": "app.run",
    "stream": "rng.streams",
    "log_metric": "store.metrics",
}

# Submodules that are part of the public surface: twice.checkpoint.save(...),
# twice.data.loader(...).
_SUBMODULES = ("checkpoint", "data", "numerics", "parallel")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'twice' has no attribute {name!r}")


def __dir__():
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from twice.app.compare import compare_runs  # noqa: F401
    from twice.app.run import Run, checkpoint_dir  # noqa: F401
    from twice.core.digests import digest  # noqa: F401
    from twice.core.divergence import first_divergence  # noqa: F401
    from twice.core.errors import DeterminismError, TwiceError  # noqa: F401
    from twice.core.records import StepRecord  # noqa: F401
    from twice.core.seeds import derive_seed  # noqa: F401
    from twice.rng.seeding import seed_everything  # noqa: F401
    from twice.rng.streams import stream  # noqa: F401
    from twice.runtime.determinism import DeterminismReport, deterministic  # noqa: F401
    from twice.store.metrics import log_metric  # noqa: F401
    from twice.store.traces import read_trace  # noqa: F401
