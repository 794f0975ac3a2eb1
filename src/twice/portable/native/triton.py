"""Portable mode's elementwise functions and Philox uniforms as Triton kernels, for CUDA tensors
(normals are Box-Muller over these, in philox.py).

Each kernel is the compiled C kernel's arithmetic (native/csrc/unary.c, itself the torch
fallback's, operation for operation) in float64, launched with `enable_fp_fusion=False` so that
no multiply and add are fused: so a GPU gives the CPU's bits. The coefficients come from
elementwise.py, as a float64 tensor. Imported only for CUDA tensors where Triton is there (it ships
with CUDA builds of torch); the torch fallbacks run otherwise. Tested on the CPU in Triton's
interpreter (TRITON_INTERPRET=1) against the fallbacks, where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from twice.portable.arithmetic.coefficients import TRITON_KERNELS, table_layout

__all__ = ["unary", "uniform", "FUNCTIONS"]

BLOCK = 1024
FUNCTIONS = {n: i for i, n in enumerate(TRITON_KERNELS)}  # the C kernels' codes
# Where each polynomial (lowest power first) and constant lies in the coefficient table
# (coefficients.table_layout, from KERNEL_ARGS itself).
_LAYOUT = table_layout()
EXP_AT: tl.constexpr = _LAYOUT["exp"][0]
EXP_N: tl.constexpr = _LAYOUT["exp"][1]
ATANH_AT: tl.constexpr = _LAYOUT["atanh"][0]
ATANH_N: tl.constexpr = _LAYOUT["atanh"][1]
ERF_AT: tl.constexpr = _LAYOUT["erf"][0]
ERF_N: tl.constexpr = _LAYOUT["erf"][1]
ERFCX_AT: tl.constexpr = _LAYOUT["erfcx"][0]
ERFCX_N: tl.constexpr = _LAYOUT["erfcx"][1]
EXPM1_AT: tl.constexpr = _LAYOUT["expm1"][0]
EXPM1_N: tl.constexpr = _LAYOUT["expm1"][1]
LN2_HI: tl.constexpr = _LAYOUT["LN2_HI"][0]
LN2_LO: tl.constexpr = _LAYOUT["LN2_LO"][0]
INV_LN2: tl.constexpr = _LAYOUT["INV_LN2"][0]
SQRT_HALF: tl.constexpr = _LAYOUT["SQRT_HALF"][0]
TWO_OVER_SQRT_PI: tl.constexpr = _LAYOUT["TWO_OVER_SQRT_PI"][0]
EXPM1_SMALL: tl.constexpr = _LAYOUT["EXPM1_SMALL"][0]
GELU_K: tl.constexpr = _LAYOUT["GELU_K"][0]
GELU_C: tl.constexpr = _LAYOUT["GELU_C"][0]


@triton.jit
def _round_even(v):
    return (v + 6755399441055744.0) - 6755399441055744.0


@triton.jit
def _pow2(k):  # k: an integral float64 in [-1022, 1023]
    bits = (k.to(tl.int64) + 1023) << 52
    return bits.to(tl.float64, bitcast=True)


@triton.jit
def _horner(table, start, count: tl.constexpr, t):
    acc = tl.load(table + start + count - 1) + t * 0.0
    for i in tl.static_range(count - 1):
        acc = acc * t
        acc = acc + tl.load(table + start + count - 2 - i)
    return acc


@triton.jit
def _frexp(x):
    bits = x.to(tl.int64, bitcast=True)
    biased = (bits >> 52) & 0x7FF
    sub = biased == 0
    scaled = tl.where(sub, x * 18014398509481984.0, x)
    sbits = scaled.to(tl.int64, bitcast=True)
    sbiased = (sbits >> 52) & 0x7FF
    e = sbiased - 1022 - tl.where(sub, 54, 0)
    m = ((sbits & -9218868437227405313) | (1022 << 52)).to(tl.float64, bitcast=True)
    special = (biased == 0x7FF) | ((bits << 1) == 0)
    return tl.where(special, x, m), tl.where(special, 0, e)


@triton.jit
def _exp(x, c):
    x = tl.where(x < -746.0, -746.0, x)
    x = tl.where(x > 710.0, 710.0, x)
    k = _round_even(x * tl.load(c + INV_LN2))
    k = tl.where(k != k, 0.0, k)
    r = (x - k * tl.load(c + LN2_HI)) - k * tl.load(c + LN2_LO)
    p = _horner(c, EXP_AT, EXP_N, r)
    half = tl.floor(k * 0.5)  # floor(k / 2) of an integer: exact
    return (p * _pow2(half)) * _pow2(k - half)


@triton.jit
def _log(x, c):
    m, e = _frexp(x)
    low = m < tl.load(c + SQRT_HALF)
    m = tl.where(low, m * 2.0, m)
    ed = (e - tl.where(low, 1, 0)).to(tl.float64)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    log_m = (s * 2.0) * _horner(c, ATANH_AT, ATANH_N, z)
    out = ed * tl.load(c + LN2_HI) + (log_m + ed * tl.load(c + LN2_LO))
    out = tl.where(x == 0, -float("inf"), out)
    out = tl.where(x == float("inf"), float("inf"), out)
    return tl.where((x < 0) | (x != x), float("nan"), out)


@triton.jit
def _expm1(x, c):
    small = tl.abs(x) < tl.load(c + EXPM1_SMALL)
    xs = tl.where(small, x, 0.0)
    series = xs * _horner(c, EXPM1_AT, EXPM1_N, xs)
    return tl.where(small, series, _exp(x, c) - 1.0)


@triton.jit
def _tanh(x, c):
    t = _expm1(tl.abs(x) * -2.0, c)
    magnitude = -t / (t + 2.0)
    return tl.where(x < 0, -magnitude, magnitude)


@triton.jit
def _erf(x, c):
    a = tl.abs(x)
    near = tl.where(a < 1.0, a, 0.0)
    series = (near * tl.load(c + TWO_OVER_SQRT_PI)) * _horner(c, ERF_AT, ERF_N, near * near)
    far = tl.where(a < 1.0, 1.0, tl.where(a > 6.0, 6.0, a))
    t = (far - 3.5) / 2.5
    erfc = _exp(-(far * far), c) * _horner(c, ERFCX_AT, ERFCX_N, t)
    magnitude = tl.where(a < 1.0, series, tl.where(a < 6.0, 1.0 - erfc, 1.0))
    magnitude = tl.where(x != x, x, magnitude)
    return tl.where(x < 0, -magnitude, magnitude)


@triton.jit
def _unary_kernel(src, dst, n, c, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(src + offsets, mask=inside, other=0.0).to(tl.float64)
    if FN == 0:
        y = _exp(x, c)
    elif FN == 1:
        y = _log(x, c)
    elif FN == 2:
        u = x + 1.0
        d = u - 1.0
        exact = d == 0
        ratio = x / tl.where(exact, 1.0, d)
        y = tl.where(exact, x, _log(u, c) * ratio)
        y = tl.where(u == float("inf"), float("inf"), y)
    elif FN == 3:
        y = _expm1(x, c)
    elif FN == 4:
        y = _tanh(x, c)
    elif FN == 5:
        y = 1.0 / (_exp(-x, c) + 1.0)
    elif FN == 6:
        y = _erf(x, c)
    elif FN == 7:
        y = x / (_exp(-x, c) + 1.0)
    elif FN == 8:
        y = (x * 0.5) * (_erf(x * tl.load(c + SQRT_HALF), c) + 1.0)
    else:
        inner = (x + ((x * x) * x) * tl.load(c + GELU_C)) * tl.load(c + GELU_K)
        y = (x * 0.5) * (_tanh(inner, c) + 1.0)
    tl.store(dst + offsets, y.to(dst.dtype.element_ty), mask=inside)


_tables: dict = {}


def _table(device, polynomials, constants) -> torch.Tensor:
    key = str(device)
    if key not in _tables:
        values = [v for poly in polynomials for v in poly] + list(constants)
        _tables[key] = torch.tensor(values, dtype=torch.float64, device=device)
    return _tables[key]


def unary(name: str, x: torch.Tensor, dtype, polynomials, constants) -> torch.Tensor:
    """elementwise.<name>(x) rounded to `dtype`, one kernel launch."""
    table = _table(x.device, polynomials, constants)
    src = x.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    grid = (triton.cdiv(max(1, x.numel()), BLOCK),)
    _unary_kernel[grid](
        src, out, x.numel(), table, FN=FUNCTIONS[name], BLOCK=BLOCK,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


@triton.jit
def _philox(c0, c1, k0, k1):
    c2 = c0 * 0
    c3 = c0 * 0
    for _ in tl.static_range(10):
        p0 = c0.to(tl.uint64) * 0xD2511F53
        p1 = c2.to(tl.uint64) * 0xCD9E8D57
        hi0, lo0 = (p0 >> 32).to(tl.uint32), p0.to(tl.uint32)
        hi1, lo1 = (p1 >> 32).to(tl.uint32), p1.to(tl.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _uniform_kernel(out, n, k0, k1, BLOCK: tl.constexpr):
    groups = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    c0 = (groups & 0xFFFFFFFF).to(tl.uint32)
    c1 = (groups >> 32).to(tl.uint32)
    w0, w1, w2, w3 = _philox(c0, c1, k0.to(tl.uint32), k1.to(tl.uint32))
    first = (w0.to(tl.uint64) << 21) ^ (w1 >> 11).to(tl.uint64)
    second = (w2.to(tl.uint64) << 21) ^ (w3 >> 11).to(tl.uint64)
    scale = 1.1102230246251565e-16  # 2**-53
    tl.store(out + 2 * groups, first.to(tl.float64) * scale, mask=2 * groups < n)
    tl.store(out + 2 * groups + 1, second.to(tl.float64) * scale, mask=2 * groups + 1 < n)


def uniform(count: int, key: int, device) -> torch.Tensor:
    """philox.uniform(count, key) on a CUDA device."""
    out = torch.empty(count, dtype=torch.float64, device=device)
    groups = max(1, -(-count // 2))
    grid = (triton.cdiv(groups, BLOCK),)
    _uniform_kernel[grid](
        out, count, key & 0xFFFFFFFF, key >> 32, BLOCK=BLOCK, enable_fp_fusion=False
    )
    return out


@triton.jit
def _ordered_mm_kernel(
    a, b, out, m, n, k, a_batch, a_row, a_col, b_batch, b_row, b_col, row_blocks, col_blocks,
    BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # one flat grid (no 65535 limit), 64-bit offsets
    z, rest = pid // (row_blocks * col_blocks), pid % (row_blocks * col_blocks)
    rows = (rest // col_blocks) * BM + tl.arange(0, BM).to(tl.int64)
    cols = (rest % col_blocks) * BN + tl.arange(0, BN).to(tl.int64)
    in_rows, in_cols = rows < m, cols < n
    left, right = a + z * a_batch + rows * a_row, b + z * b_batch + cols * b_col
    x = tl.load(left, mask=in_rows, other=0.0)
    y = tl.load(right, mask=in_cols, other=0.0)
    acc = x[:, None] * y[None, :]  # the first products, then each next one added in k's order
    for _ in range(1, k):
        left += a_col
        right += b_row
        x = tl.load(left, mask=in_rows, other=0.0)
        y = tl.load(right, mask=in_cols, other=0.0)
        acc = acc + x[:, None] * y[None, :]
    acc = tl.where(acc != acc, float("nan"), acc)  # one NaN, as the C kernel writes it
    where = out + z * m * n + rows[:, None] * n + cols[None, :]
    tl.store(where, acc, mask=in_rows[:, None] & in_cols[None, :])


def ordered_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """csrc/ordered.c's product for float64 batches a (z, m, k) and b (z, k, n), k >= 1: each
    output's sum in k's order, a multiply and an add apart (no fusion)."""
    z, m, k = a.shape
    n = b.shape[-1]
    out = torch.empty(z, m, n, dtype=torch.float64, device=a.device)
    if out.numel() == 0:
        return out
    bm = bn = 32
    row_blocks, col_blocks = triton.cdiv(m, bm), triton.cdiv(n, bn)
    _ordered_mm_kernel[(z * row_blocks * col_blocks,)](
        a, b, out, m, n, k, *a.stride(), *b.stride(), row_blocks, col_blocks, BM=bm, BN=bn,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out
