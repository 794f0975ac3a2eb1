"""The triangular factorizations: accurate to float64's precision against LAPACK, LAPACK's
layouts and pivot rule, and an element's bits independent of its batch."""

import pytest
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


def test_minus_product_takes_c_then_each_product_away_in_order():
    big = torch.tensor([[2.0**60]], dtype=torch.float64)
    a = torch.tensor([[2.0**30 + 1, 1.0]], dtype=torch.float64)
    b = torch.tensor([[2.0**30 + 1], [-1.0]], dtype=torch.float64)
    # (2^30 + 1)^2 rounds to 2^60 + 2^31; c minus it is -2^31; then minus 1 * -1
    assert float(factor.minus_product(big, a, b)) == -(2.0**31) + 1


def _symmetric(seed: int) -> torch.Tensor:
    """A symmetric matrix drawn to exercise Bunch-Kaufman's every branch: a zero or small
    diagonal forces 2x2 blocks and interchanges, a large one takes 1x1 pivots in place."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 10, (1,), generator=g))
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    a = a + a.mT
    kind = seed % 4
    if kind == 0:
        a.diagonal().zero_()
    elif kind == 1:
        a.diagonal().mul_(1e-3)
    elif kind == 2:
        a.diagonal().add_(10.0)
    return a


def test_ldl_factor_gives_lapacks_layout_and_pivots_and_solves():
    """Over generated matrices: LAPACK's pivots exactly (1x1 and 2x2 blocks, interchanges), its
    factor to float64's precision (upper triangle zero), and solves that agree with LAPACK's."""
    blocks = set()
    for seed in range(120):
        a = _symmetric(seed)
        ld, pivots, info = factor.ldl_factor(a)
        ref, ref_pivots, ref_info = torch.linalg.ldl_factor_ex(a)
        assert torch.equal(pivots, ref_pivots) and int(info) == int(ref_info), seed
        torch.testing.assert_close(ld, ref, rtol=1e-9, atol=1e-9)
        assert not ld.triu(1).any()
        if info:
            continue  # a zero pivot (a 1x1 zero matrix): nothing to solve
        b = torch.randn(a.shape[-1], 3, generator=G, dtype=torch.float64)
        x = factor.ldl_solve(ld, pivots, b)
        torch.testing.assert_close(
            x, torch.linalg.ldl_solve(ref, ref_pivots, b), rtol=1e-8, atol=1e-8
        )
        blocks.update(
            "2x2" if p < 0 else "swap" if p != i + 1 else "1x1"
            for i, p in enumerate(pivots.tolist())
        )
    assert blocks == {"1x1", "2x2", "swap"}  # every kind of step was drawn


def test_ldl_of_a_batch_a_singular_matrix_and_empty_ones():
    g = torch.Generator().manual_seed(9)
    a = torch.randn(4, 3, 3, generator=g, dtype=torch.float64)
    a = a + a.mT
    a[0].diagonal().zero_()  # 2x2 blocks
    a[3] = 0.0
    ld, pivots, info = factor.ldl_factor(a.reshape(2, 2, 3, 3))
    assert info.tolist() == [[0, 0], [0, 1]]  # the zero matrix: its first column is zero
    for i in range(4):  # each element's bits are those it has alone
        alone = factor.ldl_factor(a[i])
        assert torch.equal(ld.reshape(4, 3, 3)[i], alone[0])
        assert torch.equal(pivots.reshape(4, 3)[i], alone[1])
    empty = factor.ldl_factor(torch.zeros(2, 0, 0, dtype=torch.float64))
    assert empty[0].shape == (2, 0, 0) and empty[1].shape == (2, 0) and empty[2].shape == (2,)
    b = torch.zeros(2, 0, 4, dtype=torch.float64)
    assert factor.ldl_solve(empty[0], empty[1], b).shape == (2, 0, 4)


@pytest.mark.parametrize("power", [-300, -100, -60, 60, 100, 300])
def test_factors_and_solves_scale_exactly_with_the_matrix(power):
    """A matrix (or right-hand side) scaled by a power of two gives results scaled by it, bit
    for bit: every update is cut on a grid that scales with it (minus_product's column scale),
    so a factorization does not depend on the units the matrix is written in."""
    s = 2.0**power
    a = _symmetric(1)[:6, :6] if _symmetric(1).shape[-1] >= 6 else _symmetric(5)
    ld, pivots, _ = factor.ldl_factor(a)
    ld_s, pivots_s, info_s = factor.ldl_factor(a * s)
    d_part, k = torch.eye(a.shape[-1], dtype=torch.bool), 0  # D: the diagonal and 2x2 blocks
    while k < a.shape[-1]:
        if pivots[k] < 0:
            d_part[k + 1, k] = True
        k += 2 if pivots[k] < 0 else 1
    assert torch.equal(pivots, pivots_s) and int(info_s) == 0
    assert torch.equal(ld_s[d_part], ld[d_part] * s) and torch.equal(ld_s[~d_part], ld[~d_part])
    lu, piv, _ = factor.lu_factor(A)
    lu_s, piv_s, _ = factor.lu_factor(A * s)
    upper = torch.ones(6, 6, dtype=torch.bool).triu()
    assert torch.equal(piv, piv_s) and torch.equal(lu_s[..., upper], lu[..., upper] * s)
    assert torch.equal(lu_s[..., ~upper], lu[..., ~upper])
    root = 2.0 ** (power // 2)
    assert torch.equal(factor.cholesky(SPD * root * root)[0], factor.cholesky(SPD)[0] * root)
    x = factor.solve_triangular(SPD.tril(), B, upper=False)
    assert torch.equal(factor.solve_triangular(SPD.tril(), B * s, upper=False), x * s)
    b = torch.randn(a.shape[-1], 2, generator=G, dtype=torch.float64)
    assert torch.equal(factor.ldl_solve(ld, pivots, b * s), factor.ldl_solve(ld, pivots, b) * s)


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e30])
def test_factors_of_a_scaled_matrix_agree_with_lapack(scale):
    a = _symmetric(5) * scale
    ld, pivots, info = factor.ldl_factor(a)
    ref, ref_pivots, _ = torch.linalg.ldl_factor_ex(a)
    assert torch.equal(pivots, ref_pivots) and int(info) == 0
    torch.testing.assert_close(ld, ref, rtol=1e-10, atol=0.0)
    lu, _, _ = factor.lu_factor(A * scale)
    torch.testing.assert_close(lu, torch.linalg.lu_factor(A * scale)[0], rtol=1e-10, atol=0.0)


def test_an_update_keeps_each_column_and_each_extreme_on_its_own_scale():
    """Right-hand sides of far different scales in one call, and an update whose result
    overflows or underflows one of its parts: each column exact, then rounded once."""
    one = torch.tensor([[1.0]], dtype=torch.float64)
    mixed = factor.minus_product(
        torch.tensor([[1.0, 3.0]], dtype=torch.float64),
        one,
        torch.tensor([[1e-30, 1.0]], dtype=torch.float64),
    )
    assert mixed.tolist() == [[1.0 - 1e-30, 2.0]]
    cases = [
        (1e300, 1.0, 1e-300, 1e300),
        (1.0, 1e300, 5e-324, 1.0 - 1e300 * 5e-324),
        (3e-300, 1e-300, 1e300, -1.0),
    ]
    for c, a, b, want in cases:
        got = factor.minus_product(*(torch.tensor([[v]], dtype=torch.float64) for v in (c, a, b)))
        assert float(got) == want, (c, a, b)
    a = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    rhs = torch.tensor([[1e-30, 1.0], [1.0, 1.0]], dtype=torch.float64)
    lu, pivots, _ = factor.lu_factor(a)
    torch.testing.assert_close(
        factor.lu_solve(lu, pivots, rhs), torch.linalg.solve(a, rhs), rtol=1e-15, atol=0.0
    )


def test_a_zero_column_of_b_leaves_c_exact_and_least_squares_keep_small_columns():
    """c - a @ 0 is c, however large a is (a Householder step with tau = 0 updates nothing);
    so least squares through QR keeps a right-hand side 1e-21 in scale beside one 1e17."""
    from twice.portable.dispatch.mode import PortableMode

    c = torch.tensor([[1.6e-21, 3.0]], dtype=torch.float64)
    a = torch.tensor([[1.0]], dtype=torch.float64)
    assert factor.minus_product(c, a, torch.zeros(1, 2, dtype=torch.float64)).tolist() == c.tolist()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 5, generator=g, dtype=torch.float64)
    b = torch.randn(5, 3, generator=g, dtype=torch.float64) * torch.tensor(
        [4.5e17, 1.6e-21, 7e-7], dtype=torch.float64
    )
    with PortableMode("strict"):
        x = torch.linalg.lstsq(a, b, driver="gels").solution
    residual = (a @ x - b).norm(dim=0) / (a.norm() * x.norm(dim=0) + b.norm(dim=0))
    assert bool((residual < 1e-14).all()), residual
