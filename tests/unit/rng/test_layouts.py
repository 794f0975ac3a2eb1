"""Where each global RNG keeps its state in memory, confirmed once: a state written in place
draws like the same state set through the API, and memory is checked before it is read."""

import ctypes
import struct

import numpy as np
import torch

from twice.rng import layouts


def test_a_torch_generator_state_written_in_place_draws_like_the_same_state_set_officially():

    layout, address = layouts.torch_layout(), layouts.torch_state_address()
    assert layout is not None and address is not None
    words = np.random.default_rng(5).integers(0, 2**32, 624, dtype=np.uint64).tolist()
    official = layouts.torch_state_bytes(99, words, left=300, next_=324)
    cached = bytearray(
        official
    )  # a state holding cached normals (float and double): the write must clear them
    struct.pack_into("<dddi", cached, 5016, 0.25, 7.5, 7.5, 1)
    struct.pack_into("<f?", cached, 5048, 7.5, True)
    torch.set_rng_state(torch.frombuffer(cached, dtype=torch.uint8))
    image = bytearray(layout.template)
    struct.pack_into("<QiB3xI", image, 0, 99, 300, 1, 324)
    struct.pack_into("<624I", image, layout.words, *words)
    ctypes.memmove(address, bytes(image), layout.size)
    drawn = (
        torch.randn(()),
        torch.randn((), dtype=torch.float64),
        torch.rand(1000),
        torch.randint(0, 2**40, (7,)),
    )
    torch.set_rng_state(torch.frombuffer(bytearray(official), dtype=torch.uint8))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            drawn,
            (
                torch.randn(()),
                torch.randn((), dtype=torch.float64),
                torch.rand(1000),
                torch.randint(0, 2**40, (7,)),
            ),
        )
    )


def test_memory_is_offered_to_the_kernel_before_it_is_read_in_place():

    buffer = ctypes.create_string_buffer(3072)
    assert layouts.readable(ctypes.addressof(buffer), 3072)
    assert not layouts.readable(16, 3072)  # the first page is never mapped: an error, not a crash
