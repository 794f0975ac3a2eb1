"""The compiled kernels are cloned per instruction set (AVX-512, AVX2, the baseline) and the CPU
picks one at run time, so a machine runs only its own clone. Here the extension is built again
with one version only (TWICE_NO_CLONES), for the baseline and for AVX2, and every kernel's
output on a battery of inputs is held byte-equal to the dispatched build's (NaNs compared by
position: their sign and payload are not portable, as docs/portable.md says)."""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twice.portable import native

ROOT = Path(__file__).resolve().parents[2]

BATTERY = r"""
import hashlib, importlib.util, math, sys
path = sys.argv[1]
if path != "-":  # this build of the extension, in place of the installed one
    spec = importlib.util.spec_from_file_location("twice._native", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["twice._native"] = module
import torch
from twice.portable import native
from twice.portable.ops import norms
from twice.portable.arithmetic import philox
from twice.portable.arithmetic import elementwise as ew
from twice.portable.ops import conv as pconv
from twice.portable.ops import math as om
from twice.portable.arithmetic.exact import exact_addmm, exact_matmul, exact_sum
from twice.portable.dispatch.mode import PortableMode
assert native.available() and (path == "-" or native._module is sys.modules["twice._native"])
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
special = torch.tensor([0.0, -0.0, 1e-310, -1e-310, 5e-324, 1e-30, 0.5, 1.0, 20.0, -20.0, 700.0,
                        -745.0, 1e300, math.inf, -math.inf, math.nan])
x64 = torch.cat([special, torch.randn(70_000, generator=g, dtype=torch.float64) * 4])
x32 = x64.float()
digest = hashlib.sha256()
def add(*tensors):
    for t in tensors:
        if t is not None:  # NaN's sign and payload are not portable (docs/portable.md): one NaN
            t = torch.where(t.isnan(), math.nan, t) if t.is_floating_point() else t
            digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
def need(t):  # a compiled kernel's result: None would mean it did not run
    assert t is not None
    return t
for name in ["exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "silu", "gelu",
             "gelu_tanh", "sqrt"]:
    for x in (x64, x32):
        add(need(native.unary(name, x)), need(native.unary(name, x, torch.float64)))
for name in ["gelu_backward", "gelu_tanh_backward", "silu_backward"]:
    add(need(native.binary(name, x32 * 0.5, x32, torch.float32)))
add(need(native.binary("softplus", None, x32, torch.float32, 1.0, 20.0)))
for dt in (torch.float32, torch.float64):
    a = torch.randn(67, 301, generator=g).to(dt) * torch.rand(67, 1, generator=g).to(dt)
    b = torch.randn(301, 45, generator=g).to(dt)
    add(exact_matmul(a, b), exact_matmul(a.t().contiguous().t(), b), exact_matmul(b.t(), a.t()))
    add(exact_addmm(torch.randn(45, generator=g).to(dt), a, b, dt))
    m = torch.randn(37, 53, 11, generator=g).to(dt) * 3
    for dims in [None, (0,), (1,), (2,), (0, 2)]:
        add(exact_sum(m, dims))
    s, t1, t2 = (torch.randn(100_003, generator=g).to(dt) for _ in range(3))
    add(om._addcmul(s, t1, t2, value=-0.37), om._addcdiv(s, t1, t2, value=0.1),
        om._lerp(s, t1, 0.1), om._lerp(s, t1, 0.9), om._add(s, t1, alpha=-0.001))
    x = torch.randn(5, 6, 17, 19, generator=g).to(dt) * 3 + 1
    go = torch.randn(x.shape, generator=g).to(dt)
    w, bias = torch.randn(6, generator=g).to(dt), torch.randn(6, generator=g).to(dt)
    for train in (True, False):
        rm, rv = torch.zeros(6, dtype=dt), torch.ones(6, dtype=dt)
        out, sm, si = norms.batch_norm(x, w, bias, rm, rv, train, 0.1, 1e-5)
        saved = (sm, si) if train else (None, None)
        add(out, sm, si, rm, rv,
            *norms.batch_norm_backward(go, x, w, rm, rv, *saved, train, 1e-5, [True] * 3))
    ln = x.reshape(30, 323)
    out, mean, rstd = norms.layer_norm(ln, [323], w.repeat(54)[:323], None, 1e-5)
    add(out, mean, rstd,
        *norms.layer_norm_backward(go.reshape(30, 323), ln, [323], mean, rstd,
                                   w.repeat(54)[:323], None, [True] * 3))
    img = torch.randn(4, 3, 12, 11, generator=g).to(dt)
    k = torch.randn(5, 3, 3, 3, generator=g).to(dt)
    out = pconv.convolution(img, k, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    add(out, *pconv.convolution_backward(torch.ones_like(out), img, k, [5], [1, 1], [1, 1],
                                       [1, 1], False, [0, 0], 1, [True] * 3))
    # 21 output channels, 50 input ones: the AVX-512 tiles 16 rows / 16 columns wide, a tail
    # of 5, and the input gradient in cache
    img = torch.randn(2, 50, 7, 6, generator=g).to(dt)
    k = torch.randn(21, 50, 3, 3, generator=g).to(dt)
    out = pconv.convolution(img, k, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    add(out, *pconv.convolution_backward(torch.randn(out.shape, generator=g).to(dt), img, k,
                                       [21], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True] * 3))
    torch.manual_seed(0)  # the layer's initial weights
    lstm = torch.nn.LSTM(7, 37, num_layers=2, bidirectional=True).to(dt)
    seq = torch.randn(6, 3, 7, generator=g).to(dt).requires_grad_()
    with PortableMode("strict"):
        y, (h_n, c_n) = lstm(seq)
        (y * y).sum().add(c_n.sum()).backward()
    add(y, h_n, c_n, seq.grad, *(p.grad for p in lstm.parameters()))
from twice.portable.native import products  # float64 products in k's order: tails, k blocks
sp = special.double()
for m, k, n in [(13, 300, 37), (1, 1, 1), (6, 257, 16), (7, 16, 17)]:
    a, b = torch.randn(m, k, generator=g).double(), torch.randn(k, n, generator=g).double()
    a[0, : min(k, 16)], b[: min(k, 16), -1] = sp[: min(k, 16)], sp.flip(0)[: min(k, 16)]
    add(need(products.ordered_mm(a, b)),
        need(products.ordered_mm(a.expand(2, m, k), b.t().contiguous().t())))
    top = 2.0 ** ((53 - math.ceil(math.log2(max(k, 2)))) // 2)  # exact.py's slices' bound
    ia, ib = (a * top / 4).trunc().clamp(-top, top), (b * top / 4).trunc().clamp(-top, top)
    add(need(products.integer_mm(ia, ib)), need(products.integer_mm(ia.expand(2, m, k), ib)))
key = 123456789
add(philox.uniform(50_001, key, "cpu"), philox.normal(50_001, key, "cpu"))
print(digest.hexdigest())
"""


def _build(tmp_path: Path, name: str, cflags: str) -> Path:
    """The extension built from this checkout's sources with extra compiler flags."""
    lib, temp = tmp_path / name / "lib", tmp_path / name / "temp"
    env = {**os.environ, "CFLAGS": cflags}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(lib),
         "--build-temp", str(temp)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    built = sorted(lib.glob("twice/_native*.so"))
    assert done.returncode == 0 and built, done.stderr[-3000:]
    return built[0]


def _digest(path: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", BATTERY, path], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64")
    or shutil.which("gcc") is None
    or not native.available(),
    reason="needs an x86-64 machine with gcc and the compiled extension",
)
def test_the_baseline_and_avx2_builds_give_the_dispatched_builds_bits(tmp_path):
    dispatched = _digest("-")
    builds = {"baseline": "-DTWICE_NO_CLONES"}
    if _has("avx2"):
        builds["avx2"] = "-DTWICE_NO_CLONES -mavx2"
    if _has("avx2") and _has("fma"):  # the fused multiply-add tiles (micro_fma)
        builds["avx2_fma"] = "-DTWICE_NO_CLONES -mavx2 -mfma"
    if _has("avx512f"):  # one version, AVX-512 only: compiles without -mfma too
        builds["avx512"] = "-DTWICE_NO_CLONES -mavx512f"
    for name, flags in builds.items():
        assert _digest(str(_build(tmp_path, name, flags))) == dispatched, name
    if shutil.which("objdump"):  # the baseline really is one: no AVX registers in its kernels
        kernels = sorted((tmp_path / "baseline" / "temp").rglob("portable/native/csrc/*.o"))
        assert len(kernels) == len(list((ROOT / "src/twice/portable/native/csrc").glob("*.c")))
        for path in kernels:
            listing = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True)
            assert listing.returncode == 0 and "%ymm" not in listing.stdout, path.name
            assert "%zmm" not in listing.stdout, path.name
