"""The triangular factorizations: accurate to float64's precision against LAPACK, LAPACK's
layouts and pivot rule, and an element's bits independent of its batch."""

import torch

from twice.portable.arithmetic import factor

G = torch.Generator().manual_seed(5)
A = torch.randn(4, 6, 6, generator=G, dtype=torch.float64)
SPD = A @ A.mT + 6 * torch.eye(6, dtype=torch.float64)
B = torch.randn(4, 6, 3, generator=G, dtype=torch.float64)


def test_cholesky_agrees_with_lapack_and_flags_the_first_bad_minor():
    low, info = factor.cholesky(SPD)
    torch.testing.assert_close(low, torch.linalg.cholesky(SPD), rtol=1e-12, atol=1e-12)
    assert info.tolist() == [0, 0, 0, 0]
    bad = SPD.clone()
    bad[1, 2, 2] = -50.0
    assert factor.cholesky(bad)[1].tolist() == [0, 3, 0, 0]


def test_lu_factor_gives_lapacks_factors_and_pivots():
    lu, pivots, info = factor.lu_factor(A)
    ref_lu, ref_pivots = torch.linalg.lu_factor(A)
    assert torch.equal(pivots, ref_pivots) and info.tolist() == [0, 0, 0, 0]
    torch.testing.assert_close(lu, ref_lu, rtol=1e-10, atol=1e-12)


def test_lu_factor_of_wide_and_tall_matrices():
    for shape in ((3, 5), (5, 3)):
        a = torch.randn(shape, generator=G, dtype=torch.float64)
        lu, pivots, _ = factor.lu_factor(a)
        ref_lu, ref_pivots = torch.linalg.lu_factor(a)
        assert torch.equal(pivots, ref_pivots)
        torch.testing.assert_close(lu, ref_lu, rtol=1e-10, atol=1e-12)


def test_singular_lu_reports_the_zero_pivot_and_keeps_zeros():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    lu, _, info = factor.lu_factor(a)
    assert int(info) == 2 and bool(torch.isfinite(lu).all())


def test_solves_agree_with_lapack():
    lu, pivots, _ = factor.lu_factor(A)
    for adjoint in (False, True):
        x = factor.lu_solve(lu, pivots, B, adjoint)
        ref = torch.linalg.solve(A.mT if adjoint else A, B)
        torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-10)
    upper = torch.triu(A) + 4 * torch.eye(6, dtype=torch.float64)
    x = factor.solve_triangular(upper, B, upper=True)
    torch.testing.assert_close(x, torch.linalg.solve_triangular(upper, B, upper=True))


def test_an_elements_bits_do_not_depend_on_its_batch():
    low, _ = factor.cholesky(SPD)
    lu, pivots, _ = factor.lu_factor(A)
    x = factor.lu_solve(lu, pivots, B)
    for i in range(4):
        assert torch.equal(factor.cholesky(SPD[i])[0], low[i])
        assert torch.equal(factor.lu_factor(A[i])[0], lu[i])
        assert torch.equal(factor.lu_solve(lu[i], pivots[i], B[i]), x[i])


def test_minus_product_is_exact_then_rounded_once():
    big = torch.tensor([[2.0**60]], dtype=torch.float64)
    a = torch.tensor([[2.0**30 + 1, 1.0]], dtype=torch.float64)
    b = torch.tensor([[2.0**30 + 1], [-1.0]], dtype=torch.float64)
    # (2^30 + 1)^2 - 1 = 2^60 + 2^31: c minus it is exactly -2^31
    assert float(factor.minus_product(big, a, b)) == -(2.0**31)
