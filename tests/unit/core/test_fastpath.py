"""The step trace's hot path: digests and norms of many tensors in one call to the C module, the
same bits as digest() and as the path without it."""

import math
import struct

import pytest
import torch

import twice
from twice.core import fastpath
from twice.core.digests import digest_buffers
from unit.core.test_digests import DTYPES, sample


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_digests_and_norms_of_many_tensors_are_the_same_bits_compiled_or_not(monkeypatch, native):
    """The step trace digests gradients and parameters and takes float32/float64 norms through
    twice._native in one pass; without it (no compiler at install), through xxhash and NumPy. The
    digests are digest()'s and the norms twice's own (32 running sums in double), the same bits
    either way, so traces recorded on installs with and without the C module compare."""
    from twice.core import digests

    assert (
        digests.native is not None
    )  # built at install (setup.py): else the compiled path goes untested
    torch.manual_seed(1)
    tensors = [
        torch.randn(n, dtype=dtype) * 7
        for dtype in (torch.float32, torch.float64)
        for n in (1, 31, 32, 33, 8193, 300_001)
    ]
    tensors += [
        torch.randn(64, 130).t(),
        torch.randn(3, 5)[1],
        torch.zeros(5),
        torch.tensor([-0.0, 0.0]),
        torch.randn(0),
        torch.tensor([float("inf"), 1.0]),
        torch.tensor([float("nan")]),
        torch.randn(9).to(torch.bfloat16),
        torch.arange(12, dtype=torch.int64).reshape(3, 4),
        torch.nn.Parameter(torch.randn(4, 4)),
    ]
    # NaNs of several payloads in one running sum (elements 0, 32, 64): the norm's bits, payload
    # included (the trace writes them), must not depend on how the sums were computed
    payloads = torch.tensor([0x7FC00001, 0x7FC00123, 0x7FC54321], dtype=torch.int32).view(
        torch.float32
    )
    for order in ((0, 1, 2), (2, 0, 1)):
        nans = torch.ones(200, dtype=torch.float32)
        nans[[0, 32, 64]] = payloads[list(order)]
        tensors.append(nans)
    tensors.append(
        -torch.ones(100, dtype=torch.float32).index_fill_(0, torch.tensor([5]), float("nan"))
    )
    expected_digests = [twice.digest(t) for t in tensors]
    compiled = fastpath.digest_many(tensors, norms=True)
    if not native:
        monkeypatch.setattr(digests, "native", None)
    found, norms = fastpath.digest_many(tensors, norms=True)
    assert found == expected_digests
    bits = lambda values: [None if n is None else struct.pack("<d", n).hex() for n in values]  # noqa: E731
    assert bits(norms) == bits(compiled[1])
    for tensor, norm in zip(tensors, norms):
        if tensor.dtype in (
            torch.float32,
            torch.float64,
        ):  # a norm (not a reproducibility claim: a sanity check)
            reference = float(torch.linalg.vector_norm(tensor.detach().double()))
            assert (
                norm == reference
                or math.isclose(norm, reference, rel_tol=1e-12)
                or math.isnan(norm)
                and math.isnan(reference)
            )
        else:
            assert norm is None  # torch's, taken by the caller
    zeros, signed_zeros = norms[12 + 2], norms[12 + 3]
    assert zeros == 0.0 and signed_zeros == 0.0  # exactly zero: the zero-gradient check's test


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: no CUDA device on this machine"
)
def test_the_trace_digests_many_cuda_tensors_as_one_at_a_time():
    from twice.core.fastpath import digest_many

    tensors = [sample(dtype).cuda() for dtype in DTYPES] + [torch.randn(300, 7).cuda().t()]
    assert digest_many(tensors)[0] == [twice.digest(t) for t in tensors]


def test_items_hashed_together_are_what_digest_gives_each_alone():
    import ctypes

    from twice.core import digests

    if digests.native is None:
        pytest.skip("twice._native is not built here")
    buffer = (ctypes.c_char * 5).from_buffer_copy(b"twice")
    tensor = torch.arange(10.0)
    items = [fastpath.buffers_item(buffer, b"tail"), fastpath.tensor_item(tensor)]
    assert fastpath.hash_items(items) == [
        digest_buffers(bytes(buffer), b"tail"),
        twice.digest(tensor),
    ]
    assert fastpath.tensor_item(tensor.t().reshape(2, 5).t()) is None  # not plain: framed


def test_the_norm_sums_32_lanes_in_double_and_is_none_for_what_torch_takes():
    values = torch.arange(1.0, 70.0, dtype=torch.float32)
    assert fastpath.lanes_norm(values) == math.sqrt(sum(v * v for v in range(1, 70)))
    assert fastpath.lanes_norm(values.t()) == fastpath.lanes_norm(values.clone())
    assert fastpath.lanes_norm(values.half()) is None
    assert fastpath.lanes_norm(values.to_sparse()) is None
