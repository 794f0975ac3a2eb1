"""The constants and polynomial coefficients of twice's elementwise functions: one definition,
read by the Python functions (elementwise.py), the compiled kernels (native/__init__.py hands
KERNEL_ARGS to native/csrc/unary.c's p_init) and the Triton kernels (native/triton.py), so the
three cannot disagree. A leaf: it imports nothing of twice's."""

from __future__ import annotations

import math
from fractions import Fraction

LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # ln 2 with 32 trailing zero bits: k*LN2_HI exact
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
INV_LN2 = 1.0 / math.log(2.0)
SQRT_HALF = math.sqrt(0.5)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
EXPM1_SMALL = 0.34657359027997264  # ln2 / 2: expm1's series below, exp(x) - 1 above
GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
GELU_3C = 3 * 0.044715

EXP_TAYLOR = [float(Fraction(1, math.factorial(n))) for n in range(14)]
EXPM1_TAYLOR = [float(Fraction(1, math.factorial(n))) for n in range(1, 15)]
ATANH_ODD = [float(Fraction(1, 2 * n + 1)) for n in range(12)]
ERF_TAYLOR = [float(Fraction((-1) ** n, math.factorial(n) * (2 * n + 1))) for n in range(18)]
SIN_TAYLOR = [float(Fraction((-1) ** n, math.factorial(2 * n + 1))) for n in range(13)]
COS_TAYLOR = [float(Fraction((-1) ** n, math.factorial(2 * n))) for n in range(13)]
# erfc(x) * exp(x*x) on [1, 6] as a polynomial in t = (x - 3.5) / 2.5, highest power first
# (a Chebyshev fit made with mpmath at 40 digits; relative error 3e-16 evaluated in float64).
ERFCX_1_6 = [
    float.fromhex(h)
    for h in (
        "-0x1.0ffeb2025a844p-27",
        "0x1.4780e2b6ae9fcp-26",
        "0x1.552c0bb09da2bp-27",
        "-0x1.bdbea062e7bcep-26",
        "-0x1.c8fc66fc7bc0dp-24",
        "0x1.09fb2105f8c63p-22",
        "-0x1.0fc457ffcf943p-22",
        "0x1.224ef177e028dp-21",
        "-0x1.97bc0d3524cc9p-20",
        "0x1.b60406b96cda5p-19",
        "-0x1.bb86611d19f41p-18",
        "0x1.cd67bf2fdbdcfp-17",
        "-0x1.dc4d3878b7d9bp-16",
        "0x1.e1ece2c18fa69p-15",
        "-0x1.dffd8fc4d89c6p-14",
        "0x1.d6db0dfb1669cp-13",
        "-0x1.c669d83cfbc32p-12",
        "0x1.af197438ea57dp-11",
        "-0x1.91bd61dd48183p-10",
        "0x1.6f7002cabba84p-9",
        "-0x1.4984fb844f2d2p-8",
        "0x1.2174217335a2cp-7",
        "-0x1.f18023477afb8p-7",
        "0x1.a1b820b70ef9fp-6",
        "-0x1.56274da105a47p-5",
        "0x1.10eccd7003927p-4",
        "-0x1.a72747a5e6b50p-4",
        "0x1.3e0a99a0ee913p-3",
    )
]


KERNEL_ARGS = (
    (
        EXP_TAYLOR,
        ATANH_ODD,
        ERF_TAYLOR,
        list(reversed(ERFCX_1_6)),
        SIN_TAYLOR,
        COS_TAYLOR,
        EXPM1_TAYLOR,
    ),
    (
        LN2_HI,
        LN2_LO,
        INV_LN2,
        SQRT_HALF,
        TWO_OVER_SQRT_PI,
        math.pi / 2,
        EXPM1_SMALL,
        GELU_K,
        GELU_C,
        GELU_3C,
        INV_SQRT_2PI,
    ),
)

"""(polynomials, constants) in the order the compiled kernels' p_init takes them."""

# The compiled kernels, by code: p_unary's and p_binary's `function` is the index of the name.
# The one table: native/__init__.py maps names to codes by it and uses the C module only where its
# own list (p_kernels) is this one; the Triton kernels take their codes from it (sqrt excepted: on
# the GPU it is torch's, correctly rounded there too).
UNARY_KERNELS = (
    "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "silu", "gelu", "gelu_tanh", "sqrt",
)  # fmt: skip
BINARY_KERNELS = ("gelu_backward", "gelu_tanh_backward", "silu_backward", "softplus")
TRITON_KERNELS = UNARY_KERNELS[:-1]

# KERNEL_ARGS's polynomials by name, in its order, and its constants by name: the Triton
# kernels read the flattened table at these offsets.
POLYNOMIALS = ("exp", "atanh", "erf", "erfcx", "sin", "cos", "expm1")
CONSTANTS = (
    "LN2_HI", "LN2_LO", "INV_LN2", "SQRT_HALF", "TWO_OVER_SQRT_PI", "HALF_PI", "EXPM1_SMALL",
    "GELU_K", "GELU_C", "GELU_3C", "INV_SQRT_2PI",
)  # fmt: skip


def table_layout() -> dict[str, tuple[int, int]]:
    """{name: (offset, length)} of each polynomial and constant in the flattened KERNEL_ARGS."""
    layout, at = {}, 0
    for name, poly in zip(POLYNOMIALS, KERNEL_ARGS[0], strict=True):
        layout[name] = (at, len(poly))
        at += len(poly)
    for name in CONSTANTS:
        layout[name] = (at, 1)
        at += 1
    assert at == sum(map(len, KERNEL_ARGS[0])) + len(KERNEL_ARGS[1]), "a constant without a name"
    return layout
