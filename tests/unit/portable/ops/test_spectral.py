"""The spectral kernels under portable mode: eigenvalues, singular values, pinv, matrix_rank,
least squares and the matrix exponential agree with torch's to float32's precision,
eigenvectors up to their sign, and an element's bits do not depend on its batch."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import spectral  # noqa: F401  (the module under test registers kernels)

G = torch.Generator().manual_seed(19)
A = torch.randn(3, 5, 4, generator=G)
SQUARE = torch.randn(3, 4, 4, generator=G)
B = torch.randn(3, 5, 2, generator=G)

CASES = [
    lambda: torch.linalg.eigvalsh(SQUARE),
    lambda: torch.linalg.eigvalsh(SQUARE, UPLO="U"),
    lambda: torch.linalg.eigh(SQUARE + SQUARE.mT).eigenvectors.abs(),
    lambda: torch.linalg.svdvals(A),
    lambda: torch.linalg.svd(A, full_matrices=False).U.abs(),
    lambda: torch.linalg.matrix_norm(A, "nuc"),
    lambda: torch.linalg.cond(SQUARE),
    lambda: torch.linalg.pinv(A),
    lambda: torch.linalg.pinv(SQUARE + SQUARE.mT, hermitian=True),
    lambda: torch.linalg.matrix_rank(A),
    lambda: torch.linalg.lstsq(A, B, driver="gelsd")[:2] + (torch.linalg.lstsq(A, B)[0],),
    lambda: torch.linalg.matrix_exp(SQUARE),
    lambda: torch.linalg.matrix_exp(SQUARE * 40),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_agree_with_torch_to_float32_precision(case):
    with PortableMode("strict"):
        ours = CASES[case]()
    torch.testing.assert_close(ours, CASES[case](), rtol=1e-4, atol=1e-4)


def test_an_elements_bits_do_not_depend_on_its_batch():
    with PortableMode("strict"):
        values, vectors = torch.linalg.eigh(SQUARE)
        exp = torch.linalg.matrix_exp(SQUARE * torch.tensor([1.0, 40.0, 0.01])[:, None, None])
        for i in range(3):
            alone = torch.linalg.eigh(SQUARE[i])
            assert torch.equal(alone[0], values[i]) and torch.equal(alone[1], vectors[i])
        assert torch.equal(torch.linalg.matrix_exp(SQUARE[1] * 40.0), exp[1])


def test_matrix_exp_of_non_finite_input_is_nan():
    with PortableMode("strict"):
        out = torch.linalg.matrix_exp(torch.tensor([[float("inf"), 0.0], [0.0, 1.0]]))
    assert bool(out.isnan().all())
