"""What the pure core needs from its process: tensor memory where it lies, and the environment.

The core works on plain values; reading raw memory (ctypes arrays over a tensor's address, as
the compiled `_native` hashes addresses) and the process's environment happens here, below every
layer beside `_native`, so that no module of `core/` touches either itself.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["reader", "pinned", "Pinned", "address_of", "environ"]


def reader(nbytes: int) -> Callable[[int], Any]:
    """A function from an address to a buffer over the `nbytes` bytes there, read in place (no
    copy). Made once per size and kept: called per tensor, it is one C call."""
    return (ctypes.c_char * nbytes).from_address


class Pinned:
    """A buffer that keeps the tensor it points into alive for as long as the buffer is used."""

    __slots__ = ("tensor", "buffer")

    def __init__(self, tensor, buffer):
        self.tensor, self.buffer = tensor, buffer

    def __buffer__(self, flags):  # Python 3.12+
        return memoryview(self.buffer)

    def __len__(self):
        return len(self.buffer)


def pinned(tensor: Any, nbytes: int) -> Pinned:
    """The `nbytes` bytes of a contiguous CPU tensor where they lie, with the tensor kept alive:
    ~20x cheaper per tensor than reshape/view/numpy, which matters when a step digests dozens of
    small tensors."""
    return Pinned(tensor, reader(nbytes)(tensor.data_ptr()))


def address_of(buffer: Any) -> int:
    """The address of a ctypes array's first byte (for the compiled hash of many buffers)."""
    return ctypes.addressof(buffer)


def environ() -> Mapping[str, str]:
    """This process's environment variables, as they are now (the core parses the one it reads,
    TWICE_NO_TRITON, with core/protocol.py's ChildSettings)."""
    return os.environ
