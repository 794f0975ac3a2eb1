"""Integrations with the tools people already train and track with; each is an optional extra.

- `twice.integrations.lightning.Twice`: a PyTorch Lightning callback (`pip install
'twice[lightning]'`)
- `twice.integrations.huggingface.TwiceCallback`: a Hugging Face Trainer callback
(`twice[huggingface]`)
- `twice.integrations.mlflow.export_run`: a recorded run into an MLflow tracking store
(`twice[mlflow]`)
"""

from __future__ import annotations

import importlib
from types import ModuleType

from twice.core.errors import TwiceError

__all__ = ["MissingExtra", "require"]


class MissingExtra(TwiceError, ImportError):
    """An integration whose library is not installed."""

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}"


def require(extra: str, *modules: str) -> ModuleType:
    """The first of `modules` that imports, or MissingExtra naming the pip command that installs
    it."""
    for name in modules:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise MissingExtra(
        f"twice's {extra} integration needs {' or '.join(modules)}, which is not installed",
        f"pip install 'twice[{extra}]'",
    )
