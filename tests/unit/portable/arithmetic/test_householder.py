"""Householder QR in LAPACK's conventions: geqrf's factors and tau, orgqr and ormqr agree with
LAPACK's to float64's precision, and an element's bits do not depend on its batch."""

import torch

from twice.portable.arithmetic import householder as hh

G = torch.Generator().manual_seed(11)
A = torch.randn(3, 6, 4, generator=G, dtype=torch.float64)
C = torch.randn(3, 6, 2, generator=G, dtype=torch.float64)


def test_geqrf_agrees_with_lapack():
    packed, tau = hh.geqrf(A)
    ref_packed, ref_tau = torch.geqrf(A)
    torch.testing.assert_close(packed, ref_packed, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tau, ref_tau, rtol=1e-12, atol=1e-12)


def test_orgqr_and_ormqr_agree_with_lapack():
    packed, tau = hh.geqrf(A)
    for columns in (4, 6):
        q = hh.orgqr(packed, tau, columns)
        ref = torch.linalg.householder_product(
            torch.cat([packed, torch.zeros(3, 6, columns - 4, dtype=torch.float64)], -1), tau
        )
        torch.testing.assert_close(q, ref, rtol=1e-12, atol=1e-12)
    for transpose in (False, True):
        ours = hh.ormqr(packed, tau, C, left=True, transpose=transpose)
        ref = torch.ormqr(packed, tau, C, left=True, transpose=transpose)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
        ours = hh.ormqr(packed, tau, C.mT, left=False, transpose=transpose)
        ref = torch.ormqr(packed, tau, C.mT, left=False, transpose=transpose)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


def test_a_zero_column_leaves_its_reflector_the_identity():
    a = torch.zeros(3, 2, dtype=torch.float64)
    a[0, 1] = 1.0
    packed, tau = hh.geqrf(a)
    assert tau.tolist() == [0.0, torch.geqrf(a)[1][1].item()]


def test_an_elements_bits_do_not_depend_on_its_batch():
    packed, tau = hh.geqrf(A)
    for i in range(3):
        alone = hh.geqrf(A[i])
        assert torch.equal(alone[0], packed[i]) and torch.equal(alone[1], tau[i])
