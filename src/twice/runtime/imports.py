"""Run a callback the moment a module finishes importing (standard library only: the bootstrap
uses it)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

__all__ = ["when_imported"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after the module named `name` has finished executing."""

    def __init__(self, name: str, callback: Callable):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and so that the real finders below are used
        parent = sys.modules.get(fullname.rpartition(".")[0]) if "." in fullname else None
        spec = (
            importlib.util.find_spec(fullname)
            if parent is None or hasattr(parent, "__path__")
            else None
        )
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self.callback

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                callback(module)

        spec.loader = _Loader()
        return spec


def when_imported(name: str, callback: Callable) -> None:
    """`callback(module)` now if `name` is imported, else right after its import completes."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
