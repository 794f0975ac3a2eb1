"""The device fold as Triton kernels (twice/_fold_kernel.py): `fold_sums` (one tensor) and
`fold_many` (many tensors in one launch) give device_fold's bits.

Their arithmetic runs on the CPU in Triton's interpreter, in a process of its own: Triton decides
whether it interprets as it decorates each kernel, its own standard library's included, so at
its import, which torch may already have made in this process."""

import importlib.util
import os
import struct
import subprocess
import sys

import pytest
import torch

from twice.core.device_fold import device_fold

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs Triton (the test extra installs it on Linux x86-64)",
)


def _interpreted(code, *args):
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )


def test_tensors_of_no_bytes_fold_without_a_launch():
    from twice import _fold_kernel

    empty = torch.zeros(0, dtype=torch.uint8)
    assert struct.pack("<q", 0) + _fold_kernel.fold_sums(empty).numpy().astype(
        "<i8"
    ).tobytes() == device_fold(torch.zeros(0))
    assert torch.equal(
        _fold_kernel.fold_many([empty, empty], []), torch.zeros((2, 4), dtype=torch.int64)
    )


TRITON_FOLD = """
import struct, torch
from twice.core.device_fold import device_fold
from twice._fold_kernel import fold_sums
def folded(tensor):
    raw = tensor.contiguous().reshape(-1).view(torch.uint8)
    return struct.pack("<q", raw.numel()) + fold_sums(raw).numpy().astype("<i8").tobytes()
generator = torch.Generator().manual_seed(0)
cases = [torch.randn(5000, generator=generator), torch.zeros(0), torch.arange(13, dtype=torch.int8),
         torch.randn(4099, generator=generator, dtype=torch.float64), torch.ones(3).bool()]
assert all(folded(t) == device_fold(t) for t in cases)
print("same bits")
"""


@pytest.mark.slow  # costly on two cores; run by make test-slow and CI
def test_the_triton_fold_kernel_gives_the_device_folds_bits_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", TRITON_FOLD],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert result.returncode == 0 and "same bits" in result.stdout, result.stderr[-3000:]


FOLD_MANY = """
import random, struct, sys, torch
from twice._fold_kernel import fold_many
from twice.core.device_fold import device_fold
rng = random.Random(int(sys.argv[1]))
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.bool, torch.int64, torch.int32]
def tensor():
    dtype, size = rng.choice(dtypes), rng.choice([0, 1, 3, 7, 8, 255, 2048, 2049, 4099, 9000])
    seeded = torch.Generator().manual_seed(rng.getrandbits(31))
    base = torch.randint(-100, 100, (size + 3,), generator=seeded)
    scale = 1.37 if dtype.is_floating_point else 1
    base = (base != 0) if dtype is torch.bool else base.to(dtype) * scale
    form = rng.choice(["plain", "offset", "strided"])
    if form == "offset":  # a view that starts inside a word
        return base[rng.randint(1, 3):][:size]
    if form == "strided" and size > 1:
        return base[: size // 2 * 2].reshape(-1, 2).t()
    return base[:size]
for case in range(int(sys.argv[2])):
    tensors = [tensor() for _ in range(rng.randint(1, 9))]
    raws = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    sums = fold_many(raws, [])
    for t, raw, row in zip(tensors, raws, sums):
        got = struct.pack("<q", raw.numel()) + row.numpy().astype("<i8").tobytes()
        assert got == device_fold(t), (case, t.dtype, tuple(t.shape), t.stride())
print("same bits")
"""


def test_one_launch_over_many_tensors_gives_each_tensors_device_fold():
    cases = "200" if os.environ.get("TWICE_EXHAUSTIVE") == "1" else "25"
    result = _interpreted(FOLD_MANY, "0", cases)
    assert result.returncode == 0 and "same bits" in result.stdout, result.stderr[-3000:]
