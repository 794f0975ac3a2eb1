"""Jacobi eigh and SVD: eigenvalues and singular values to float64's precision against LAPACK,
orthonormal vectors that reconstruct the matrix, the sign rule, and batch-independent bits."""

import torch

from twice.portable.arithmetic import jacobi

G = torch.Generator().manual_seed(13)
A = torch.randn(3, 5, 5, generator=G, dtype=torch.float64)
SYM = A + A.mT
EYE = torch.eye(5, dtype=torch.float64)


def test_rounds_visit_every_pair_once():
    for n in (1, 2, 5, 8):
        pairs = [(int(p), int(q)) for ps, qs in jacobi.rounds(n) for p, q in zip(ps, qs)]
        size = n + n % 2
        assert sorted(pairs) == [(p, q) for p in range(size) for q in range(p + 1, size)]


def test_eigh_agrees_with_lapack_and_reconstructs():
    values, vectors = jacobi.eigh(SYM)
    torch.testing.assert_close(values, torch.linalg.eigvalsh(SYM), rtol=1e-12, atol=1e-12)
    rebuilt = (vectors * values.unsqueeze(-2)) @ vectors.mT
    torch.testing.assert_close(rebuilt, SYM, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vectors.mT @ vectors, EYE.expand(3, 5, 5), rtol=0, atol=1e-13)
    lead = vectors.gather(-2, vectors.abs().argmax(-2, keepdim=True))
    assert bool((lead > 0).all())
    assert torch.equal(jacobi.eigh(SYM, vectors=False)[0], values)


def test_svd_agrees_with_lapack_for_every_shape():
    for shape in ((5, 3), (3, 5), (4, 4)):
        a = torch.randn(2, *shape, generator=G, dtype=torch.float64)
        for full in (False, True):
            u, s, v = jacobi.svd(a, full)
            torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=1e-12, atol=1e-12)
            k = s.shape[-1]
            rebuilt = (u[..., :k] * s.unsqueeze(-2)) @ v[..., :k].mT
            torch.testing.assert_close(rebuilt, a, rtol=1e-12, atol=1e-12)
            eye = torch.eye(u.shape[-1], dtype=torch.float64)
            torch.testing.assert_close(u.mT @ u, eye.expand_as(u.mT @ u), rtol=0, atol=1e-13)


def test_rank_deficient_svd_completes_u_orthonormally():
    a = torch.randn(6, 3, generator=G, dtype=torch.float64)
    a[:, 2] = 0.0
    u, s, v = jacobi.svd(a, True)
    assert float(s[2]) == 0.0
    torch.testing.assert_close(u.mT @ u, torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-13)


def test_an_elements_bits_do_not_depend_on_its_batch():
    values, vectors = jacobi.eigh(SYM)
    u, s, v = jacobi.svd(A, False)
    for i in range(3):
        alone = jacobi.eigh(SYM[i])
        assert torch.equal(alone[0], values[i]) and torch.equal(alone[1], vectors[i])
        assert all(torch.equal(x, y[i]) for x, y in zip(jacobi.svd(A[i], False), (u, s, v)))
