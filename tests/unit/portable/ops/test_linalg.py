"""The linear algebra kernels under portable mode (ldl_factor and ldl_solve among them):
torch's results to float32's precision,
torch's outputs and errors for singular inputs, and bits independent of the batch and of the
compiled kernels."""

import pytest
import torch

from twice.portable import native
from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import linalg  # noqa: F401  (the module under test registers kernels)

G = torch.Generator().manual_seed(7)
A = torch.randn(3, 5, 5, generator=G)
SPD = A @ A.mT + 5 * torch.eye(5)
B = torch.randn(3, 5, 2, generator=G)

CASES = [
    lambda: torch.linalg.cholesky(SPD),
    lambda: torch.linalg.cholesky(SPD, upper=True),
    lambda: torch.cholesky_solve(B, torch.linalg.cholesky(SPD)),
    lambda: torch.cholesky_inverse(torch.linalg.cholesky(SPD)),
    lambda: torch.linalg.solve(A, B),
    lambda: torch.linalg.solve(A, B.mT, left=False),
    lambda: torch.linalg.inv(A),
    lambda: torch.linalg.det(A),
    lambda: torch.linalg.slogdet(A)[1],
    lambda: torch.linalg.lu_factor(A)[0],
    lambda: torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B, adjoint=True),
    lambda: torch.linalg.solve_triangular(torch.triu(SPD), B, upper=True),
    lambda: torch.linalg.solve_triangular(torch.tril(SPD), B.mT, upper=False, left=False),
    lambda: torch.trace(A[0]),
    lambda: torch.linalg.cross(A[..., :3], B[..., :1].expand(3, 5, 3)),
    lambda: torch.linalg.ldl_factor(A + A.mT)[0],
    lambda: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(A + A.mT), B),
    lambda: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(A[0] + A[0].mT, hermitian=True), B),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_agree_with_torch_to_float32_precision(case):
    with PortableMode("strict"):
        ours = CASES[case]()
    reference = CASES[case]()
    torch.testing.assert_close(ours, reference, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bits_do_not_depend_on_the_compiled_kernels(case):
    with PortableMode("strict"):
        ours = CASES[case]()
        with native.fallback():
            again = CASES[case]()
    assert torch.equal(ours, again)


def test_an_elements_bits_do_not_depend_on_its_batch():
    with PortableMode("strict"):
        whole = torch.linalg.solve(A, B)
        inv = torch.linalg.inv(A)
        ld, pivots = torch.linalg.ldl_factor(A + A.mT)
        for i in range(3):
            assert torch.equal(torch.linalg.solve(A[i], B[i]), whole[i])
            assert torch.equal(torch.linalg.inv(A[i]), inv[i])
            assert torch.equal(torch.linalg.ldl_factor(A[i] + A[i].mT)[0], ld[i])


def test_singular_inputs_give_torchs_kinds_of_result():
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    with PortableMode("strict"):
        assert float(torch.linalg.det(singular)) == 0.0
        sign, logabs = torch.linalg.slogdet(singular)
        assert float(sign) == 0.0 and float(logabs) == -float("inf")
        assert int(torch.linalg.inv_ex(singular).info) == 2
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.inv(singular)
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.cholesky(-torch.eye(2))
        assert int(torch.linalg.ldl_factor_ex(torch.zeros(2, 2)).info) == 1
        with pytest.raises(torch.linalg.LinAlgError):  # torch's own check fails with an assert
            torch.linalg.ldl_factor_ex(torch.zeros(2, 2), check_errors=True)


def test_gradients_run_through_the_mode_and_agree_with_torch():
    a = A.clone().requires_grad_()
    with PortableMode("strict"):
        (torch.linalg.solve(a, B).sum() + torch.linalg.det(a).sum()).backward()
    ours, a.grad = a.grad, None
    (torch.linalg.solve(a, B).sum() + torch.linalg.det(a).sum()).backward()
    torch.testing.assert_close(ours, a.grad, rtol=1e-4, atol=1e-4)
