"""The one compiled part, twice._native (src/twice/_native.c, its families in src/twice/csrc/):
the data loader's per-sample fetch loop, the step trace's many-buffer digests, the trace lines'
validation, comparison and series, and portable mode's kernels (one family a file in
src/twice/portable/native/csrc/), with xxHash vendored (vendor/xxhash, BSD 2-Clause).

Optional: where no C compiler is found the install goes on without it, and twice uses its Python
code instead (the same results bit for bit, at a higher cost). Everything else is in pyproject.toml."""

import platform
import sys
from glob import glob

from setuptools import Extension, setup

sources, macros, flags = ["src/twice/_native.c", "vendor/xxhash/xxhash.c"], [], []
sources += [f"src/twice/csrc/{family}.c" for family in ("fetch", "hashing", "records")]
sources += sorted(glob("src/twice/portable/native/csrc/*.c"))
if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86"):
    # xxHash's own run-time choice of SSE2, AVX2 or AVX-512 (baseline flags only, so the build
    # runs on any x86 CPU), as the xxhash package builds it.
    sources.append("vendor/xxhash/xxh_x86dispatch.c")
    macros.append(("TWICE_XXH_DISPATCH", "1"))
if sys.platform != "win32":
    # No fused multiply-add where the source does not ask for one (contraction): the norms must have
    # the bits of the NumPy code path on every CPU (csrc/hashing.c's explicit one is exact: see
    # there).
    # Hidden symbols: xxHash's names must not bind to another library's copy.
    flags += ["-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden"]

setup(ext_modules=[Extension("twice._native", sources, include_dirs=["vendor/xxhash"], define_macros=macros,
                             extra_compile_args=flags, depends=["vendor/xxhash/xxhash.h", "vendor/xxhash/xxh_x86dispatch.h",
                                                                "src/twice/csrc/native.h",
                                                                *sorted(glob("src/twice/portable/native/csrc/*.h"))],
                             optional=True)])
