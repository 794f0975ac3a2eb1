"""Named RNG streams: randomness for one purpose ("init", "data", "dropout") that other purposes
cannot shift.

Inside `with twice.stream("init"):` the global RNGs (Python, NumPy, torch CPU and CUDA) draw from
the "init" stream, seeded from derive_seed(root, "stream", "init") on first use and continued on
each later entry; on exit the other streams' state is put back untouched. So adding an evaluation
pass that draws random numbers, or changing the learning rate, leaves the initial weights and the
training batches bit-identical.
"""

from __future__ import annotations

import os
from typing import Any

from twice.core.protocol import ChildSettings
from twice.core.seeds import derive_seed
from twice.rng.seeding import capture_rng, restore_rng, seed_everything

__all__ = ["stream"]

_saved: dict[tuple[int, str], dict[str, Any]] = {}


def _root() -> int:
    return ChildSettings.read(os.environ, "seed") or 0


class stream:
    """A named RNG stream; a context manager, and a factory of generators for the same purpose.

    >>> with twice.stream("init"):                      # doctest: +SKIP
    ...     model = Net()                # initial weights depend only on (seed, "init")
    >>> data_order = twice.stream("data").generator()   # doctest: +SKIP
    >>> loader = DataLoader(data, shuffle=True, generator=data_order)   # doctest: +SKIP
    """

    def __init__(self, name: str, seed: int | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError("a stream needs a non-empty name")
        self.name = name
        self.root = _root() if seed is None else seed
        self.seed = derive_seed(self.root, "stream", name)
        self._outer: dict[str, Any] | None = None

    @staticmethod
    def reset() -> None:
        """Forget every stream's position: the next entry into each starts from its seed again
        (for several runs in one process, such as tests)."""
        _saved.clear()

    def generator(self, device: str = "cpu"):
        """A fresh torch.Generator seeded for this stream (independent of the global RNGs)."""
        import torch

        return torch.Generator(device=device).manual_seed(self.seed)

    def numpy_generator(self):
        """A fresh numpy.random.Generator seeded for this stream."""
        import numpy as np

        return np.random.default_rng(self.seed)

    def __enter__(self) -> stream:
        self._outer = capture_rng()
        key = (self.root, self.name)
        if key in _saved:
            restore_rng(_saved[key])
        else:
            seed_everything(self.seed)
        return self

    def __exit__(self, *exc) -> None:
        try:
            _saved[(self.root, self.name)] = capture_rng()
        finally:
            restore_rng(self._outer or {})
            self._outer = None
