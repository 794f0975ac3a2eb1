"""CPU digest throughput on a 256 MB tensor, against SHA-256 on the same bytes (measured side by
side).

Target (issue 3): at least 8 GB/s per core.
"""

import hashlib
import time

import torch
from _common import size

import twice


def best_of(function, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    torch.set_num_threads(1)
    tensor = torch.randn(size("MIB", 256, 4) * 256 * 1024)  # 256 MiB of float32
    size_gb = tensor.numel() * tensor.element_size() / 1e9
    ours = best_of(lambda: twice.digest(tensor))
    sha = best_of(lambda: hashlib.sha256(tensor.numpy()).hexdigest(), repeats=2)
    strided = tensor[::2]
    ours_strided = best_of(lambda: twice.digest(strided), repeats=3)
    print(
        f"twice.digest: {size_gb / ours:.1f} GB/s   sha256: {size_gb / sha:.2f} GB/s   "
        f"ratio {sha / ours:.1f}x (target >= 8 GB/s, one thread)"
    )
    print(
        f"twice.digest on a non-contiguous view (copy first): {size_gb / 2 / ours_strided:.1f} GB/s"
    )


if __name__ == "__main__":
    main()
