"""twice: run PyTorch training twice and get the same bits; when you don't, learn where and why.

The public surface is `__all__`; attributes load on first use so that importing twice (which the
`twice run` bootstrap does in every process) costs almost nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "seed_everything": "seeding",
    "deterministic": "determinism",
    "DeterminismReport": "determinism",
    "derive_seed": "seeds",
    "digest": "digests",
    "Run": "run",
    "TwiceError": "errors",
    "DeterminismError": "errors",
    "StepRecord": "trace",
    "read_trace": "trace",
    "first_divergence": "divergence",
    "compare_runs": "compare",
    "checkpoint_dir": "run",
    "stream": "streams",
    "log_metric": "metrics",
}

# Submodules that are part of the public surface: twice.checkpoint.save(...), twice.data.loader(...).
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
    from .determinism import DeterminismReport, deterministic
    from .digests import digest
    from .compare import compare_runs
    from .divergence import first_divergence
    from .errors import DeterminismError, TwiceError
    from .metrics import log_metric
    from .run import Run, checkpoint_dir
    from .streams import stream
    from .seeding import seed_everything
    from .seeds import derive_seed
    from .trace import StepRecord, read_trace
