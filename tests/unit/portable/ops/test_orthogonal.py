"""The QR family's kernels under portable mode: torch's results to float32's precision (LAPACK's
sign conventions are Householder's, so Q and R agree entry by entry) and batch-independent
bits."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import orthogonal  # noqa: F401  (the module under test registers kernels)

G = torch.Generator().manual_seed(17)
A = torch.randn(3, 6, 4, generator=G)
B = torch.randn(3, 6, 2, generator=G)

CASES = [
    lambda: torch.linalg.qr(A),
    lambda: torch.linalg.qr(A, mode="complete"),
    lambda: torch.linalg.qr(A.mT, mode="r")[1],
    lambda: torch.geqrf(A),
    lambda: torch.linalg.householder_product(*torch.geqrf(A)),
    lambda: torch.ormqr(*torch.geqrf(A), B, transpose=True),
    lambda: torch.linalg.lstsq(A, B, driver="gels")[:2],
    lambda: torch.linalg.lstsq(A.mT, B[..., :4, :]).solution,
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_agree_with_torch_to_float32_precision(case):
    with PortableMode("strict"):
        ours = CASES[case]()
    torch.testing.assert_close(ours, CASES[case](), rtol=1e-4, atol=1e-4)


def test_an_elements_bits_do_not_depend_on_its_batch():
    with PortableMode("strict"):
        q, r = torch.linalg.qr(A)
        for i in range(3):
            alone = torch.linalg.qr(A[i])
            assert torch.equal(alone[0], q[i]) and torch.equal(alone[1], r[i])
