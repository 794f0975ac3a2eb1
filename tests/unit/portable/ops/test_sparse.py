"""ops/sparse: products with a CSR matrix (mm on either side, sampled_addmm): the bits of the
portable product of its placed dense matrix, within a unit in the last place of a Fraction
reference, over generated matrices (empty rows, stored zeros, shapes);
bits independent of the thread count; what may hold a position twice, batched and other
layouts, and a non-finite dense operand refused by name; a sparse tensor's total and its
selections (to_dense, sparse_mask) exact."""

import warnings
from fractions import Fraction

import pytest
import torch

from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.dispatch.mode import PortableError, PortableMode
from twice.portable.ops import sparse
from unit.portable.bits import same_bits

warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", "Sparse invariant checks")


def _csr(seed: int, m: int, n: int) -> torch.Tensor:
    """A CSR matrix with about half its positions stored, some of them zeros, some rows empty."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(m, n, generator=g) * torch.randint(0, 2, (m, n), generator=g)
    if m > 1:
        dense[m // 2] = 0.0
    stored = dense != 0
    if n > 1 and m > 0:
        stored[0, 0] = True  # a stored zero
        dense[0, 0] = 0.0
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), stored.sum(1).cumsum(0)])
    col = stored.nonzero()[:, 1]
    return torch.sparse_csr_tensor(crow, col, dense[stored], (m, n))


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b summed in Fractions and rounded once to float32 (through float64, exact here)."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float64)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            total = sum(
                Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(a.shape[1])
            )
            out[i, j] = float(total)
    return out.float()


@pytest.mark.parametrize("seed", range(12))
def test_csr_products_are_exact_sums_rounded_once(seed):
    g = torch.Generator().manual_seed(100 + seed)
    m, k, n = (int(v) for v in torch.randint(1, 6, (3,), generator=g))
    s = _csr(seed, m, k)
    right, left = torch.randn(k, n, generator=g), torch.randn(n, m, generator=g)
    with PortableMode("strict"):
        ours = (torch.mm(s, right), torch.mm(left, s), s @ right)
    dense = s.to_dense()
    placed = (exact_matmul(dense, right), exact_matmul(left, dense), exact_matmul(dense, right))
    fractions = (_exact(dense, right), _exact(left, dense), _exact(dense, right))
    pairs = ((dense, right), (left, dense), (dense, right))
    for got, want, reference, (a, b) in zip(ours, placed, fractions, pairs):
        assert got.layout is torch.strided and same_bits(got, want)
        # docs/portable.md's precision: 21 bits below each row's (column's) largest magnitude
        rows, cols = a.abs().amax(1, keepdim=True), b.abs().amax(0, keepdim=True)
        bound = 2.0**-20 * a.shape[1] * (rows * cols).double()
        assert bool(((got.double() - reference.double()).abs() <= bound).all())


def test_sampled_addmm_is_alpha_times_the_exact_product_plus_beta_times_self():
    g = torch.Generator().manual_seed(3)
    s = _csr(4, 5, 6)
    mat1, mat2 = torch.randn(5, 3, generator=g), torch.randn(3, 6, generator=g)
    with PortableMode("strict"):
        out = torch.sparse.sampled_addmm(s, mat1, mat2, beta=0.2, alpha=0.6)
        empty = torch.sparse.sampled_addmm(s, mat1[:, :0], mat2[:0], beta=0.5)
    assert torch.equal(out.crow_indices(), s.crow_indices())
    assert torch.equal(out.col_indices(), s.col_indices())
    rows = torch.repeat_interleave(torch.arange(5), s.crow_indices().diff())
    product = exact_matmul(mat1, mat2)[rows, s.col_indices()]
    alpha, beta = torch.tensor(0.6), torch.tensor(0.2)
    assert same_bits(out.values(), alpha * product + beta * s.values())
    assert same_bits(empty.values(), s.values() * 0.5)


def test_csr_products_do_not_depend_on_the_thread_count():
    s, d = _csr(7, 40, 50), torch.randn(50, 30, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    found = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with PortableMode("strict"):
                found.append((torch.mm(s, d), torch.sparse.sampled_addmm(s, d[:40], d.mT).values()))
    finally:
        torch.set_num_threads(threads)
    assert all(same_bits(a, b) for a, b in zip(*found))


def test_gradients_of_sampled_addmm_run_through_the_mode():
    g = torch.Generator().manual_seed(5)
    s = _csr(2, 4, 5).requires_grad_()
    mat1 = torch.randn(4, 3, generator=g, requires_grad=True)
    mat2 = torch.randn(3, 5, generator=g, requires_grad=True)
    with PortableMode("strict"):
        grads = torch.autograd.grad(
            torch.sparse.sampled_addmm(s, mat1, mat2).sum(), [s, mat1, mat2]
        )
    plain = torch.autograd.grad(torch.sparse.sampled_addmm(s, mat1, mat2).sum(), [s, mat1, mat2])
    for a, b in zip(grads, plain):
        a, b = (t.to_dense() if t.layout is not torch.strided else t for t in (a, b))
        torch.testing.assert_close(a, b)


_BSR = torch.ones(4, 4).to_sparse_bsr((2, 2))
_BIG = torch.sparse_csr_tensor(
    torch.zeros(5001, dtype=torch.int64),
    torch.zeros(0, dtype=torch.int64),
    torch.zeros(0),
    (5000, 5000),
)


def _duplicated() -> torch.Tensor:
    crow, col = torch.tensor([0, 2, 2]), torch.tensor([1, 1])
    return torch.sparse_csr_tensor(crow, col, torch.tensor([1.0, 2.0]), (2, 3))


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.mm(_duplicated(), torch.randn(3, 2)),  # a position held twice
        lambda: torch.mm(_csr(1, 3, 3), torch.tensor([[float("inf")] * 2] * 3)),
        lambda: torch.mm(_BSR, torch.randn(4, 2)),
        lambda: torch.mm(_BIG, torch.ones(5000, 1)),  # too large to place densely
        lambda: torch.mm(_csr(1, 3, 3).to_sparse_coo(), torch.randn(3, 2)),
        lambda: torch.sparse.sampled_addmm(_duplicated(), torch.randn(2, 2), torch.randn(2, 3)),
        lambda: _duplicated().to_dense(),
        lambda: torch.stack([_csr(1, 3, 3).to_dense()] * 2).to_sparse_csr() @ torch.randn(2, 3, 2),
    ],
)
def test_what_torch_would_sum_in_its_own_order_is_refused_by_name(call):
    with PortableMode("strict"), pytest.raises(PortableError):
        call()


def test_a_sparse_total_and_selections_are_exact():
    s = _csr(9, 6, 7)
    with PortableMode("strict"):
        total = s.sum()
        dense = s.to_dense()
        masked = torch.randn(6, 7).sparse_mask(s)
        again = s.sparse_mask(s)
    assert same_bits(total, _exact(s.values().reshape(1, -1), torch.ones(s._nnz(), 1))[0, 0])
    assert torch.equal(dense, s.to_dense()) and masked.layout is torch.sparse_csr
    assert torch.equal(again.values(), s.values())
    assert sparse.distinct(s) and not sparse.distinct(_duplicated())


def test_a_csc_matrix_autograds_transpose_is_placed_as_its_transpose():
    """A GCN layer's backward: the gradient of the dense operand goes through the CSR matrix's
    transpose, a CSC one; a CSC matrix given directly is placed the same way."""
    s, w = _csr(3, 5, 4), torch.randn(4, 3, requires_grad=True)
    csc, ones = s.to_sparse_csc(), torch.ones(4, 2)
    with PortableMode("strict"):
        (grad,) = torch.autograd.grad(torch.mm(s, w).sum(), w)
        direct = torch.mm(csc, ones)
    assert same_bits(grad, exact_matmul(s.to_dense().t(), torch.ones(5, 3)))
    assert same_bits(direct, exact_matmul(s.to_dense(), ones))
    with PortableMode("strict"), pytest.raises(RuntimeError, match="one dtype"):
        torch.mm(s, torch.ones(4, 2, dtype=torch.float64))
