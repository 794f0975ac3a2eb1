"""record/norms: the step trace's L2 norms, the same bits whichever way they are computed."""

import pytest
import torch

from twice.record import norms


def test_the_torch_norms_on_the_cpu_are_the_fused_kernels_bit_for_bit():
    """For CPU tensors other than float32/float64 (bfloat16, float16 gradients) the trace reads
    each norm with one vector_norm (cheaper on cold caches than the fused call): the values must be
    the fused kernel's, bit for bit, or a trace recorded by one would differ from the other."""
    torch.manual_seed(0)
    tensors = [
        torch.randn(n, dtype=dtype) * 7
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
        for n in (1, 33, 4097, 300_001)
    ]
    tensors += [
        torch.randn(64, 130).t(),
        torch.zeros(5),
        torch.tensor([float("inf"), 1.0]),
        torch.randn(0),
    ]
    fused = [float(n) for n in torch._foreach_norm(tensors)]
    ours = norms.norms(tensors)
    assert [float(x).hex() for x in ours] == [x.hex() for x in fused]
    parameter = torch.nn.Parameter(torch.randn(10))
    (norm,) = norms.norms([parameter])
    assert isinstance(norm, float) and norm == float(torch.linalg.vector_norm(parameter.detach()))


@pytest.mark.filterwarnings("ignore:Sparse")
def test_a_sparse_gradients_norm_is_the_dense_tensors():
    """Duplicates of a sparse COO gradient are summed first: its norm is the dense tensor's."""
    sparse = torch.sparse_coo_tensor([[0, 0, 2], [1, 1, 0]], [3.0, 1.0, -2.0], (3, 2))
    dense = sparse.to_dense()
    assert torch.equal(norms.tensor_norm(sparse), torch.linalg.vector_norm(dense))
    assert float(norms.tensor_norm(dense.to_sparse_csr())) == float(norms.tensor_norm(sparse))
    assert norms.norms([]) == [] and norms.floats([torch.tensor(2.5), 1.0]) == [2.5, 1.0]
