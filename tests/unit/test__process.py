"""What the pure core takes from its process: a tensor's bytes where they lie (kept alive with
the buffer), a ctypes array's address, and the environment as it is now."""

import ctypes
import gc
import os

import torch

from twice import _process


def test_a_tensors_bytes_are_read_in_place_and_the_tensor_lives_as_long_as_the_buffer():
    tensor = torch.arange(6, dtype=torch.float32)
    expected = tensor.numpy().tobytes()
    buffer = _process.pinned(tensor, tensor.numel() * 4)
    del tensor
    gc.collect()
    assert bytes(buffer.buffer) == expected and len(buffer) == 24
    buffer.tensor.add_(1)  # the same memory: a write through the tensor shows in the buffer
    assert bytes(buffer.buffer) != expected
    view = _process.reader(8)(buffer.tensor.data_ptr())
    assert bytes(view) == torch.tensor([1.0, 2.0]).numpy().tobytes()


def test_an_address_is_the_arrays_first_byte_and_the_environment_is_live(monkeypatch):
    array = (ctypes.c_char * 4).from_buffer_copy(b"abcd")
    assert ctypes.string_at(_process.address_of(array), 4) == b"abcd"
    monkeypatch.setenv("TWICE_PROCESS_TEST", "1")
    assert _process.environ()["TWICE_PROCESS_TEST"] == "1" and _process.environ() is os.environ
