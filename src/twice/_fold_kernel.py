"""device_fold as one Triton kernel, for CUDA tensors: every word is read once and folded in
registers, where the torch expression of the same arithmetic makes some thirty passes over memory
(about 1% of an H200's copy bandwidth). Same arithmetic, same bits: each program sums its block
of words into four int64 lanes, and the blocks' sums are added modulo 2**64 (exact, any order).

It sits beside the compiled `_native`, below every layer, not in the pure core (which imports
nothing heavy at module level). Imported only when a CUDA tensor is folded and Triton is there
(it ships with CUDA builds of torch); `device_fold` falls back to the torch expression otherwise.
Its arithmetic is tested on the CPU in Triton's interpreter, and against the CPU fold on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["fold_sums"]

BLOCK = 2048


@triton.jit
def _mix64(x):
    # splitmix64's finaliser on uint64 (logical shifts, wrapping products)
    x = x ^ (x >> 30)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 27)
    x = x * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _fold_block(words, n, first, out, BLOCK: tl.constexpr):
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    word = tl.load(words + offsets, mask=inside, other=0).to(tl.uint64, bitcast=True)
    index = (offsets + first).to(tl.uint64)
    low = word & 0xFFFFFFFF
    high = word >> 32
    for lane in tl.static_range(2):
        key = _mix64(index * 2 + (lane * (1 << 40) + 0x5EED))
        product = ((low + (key & 0xFFFFFFFF)) & 0xFFFFFFFF) * ((high + (key >> 32)) & 0xFFFFFFFF)
        nothing = tl.zeros_like(product)
        product_sum = tl.sum(tl.where(inside, product, nothing), axis=0)
        xor_sum = tl.sum(tl.where(inside, word ^ key, nothing), axis=0)
        tl.store(out + block * 4 + lane, product_sum.to(tl.int64, bitcast=True))
        tl.store(out + block * 4 + 2 + lane, xor_sum.to(tl.int64, bitcast=True))


def fold_sums(raw):
    """device_fold's four sums of a 1-d uint8 tensor, as an int64 tensor on its device (no
    sync)."""
    import torch

    nbytes = raw.numel()
    whole = nbytes - nbytes % 8
    parts = []
    if whole:
        words = raw[:whole].view(torch.int64)
        parts.append(_launch(words, 0))
    if whole != nbytes:  # the last, partial word, padded with zero bytes
        tail = torch.zeros(8, dtype=torch.uint8, device=raw.device)
        tail[: nbytes - whole] = raw[whole:]
        parts.append(_launch(tail.view(torch.int64), whole // 8))
    if not parts:
        return torch.zeros(4, dtype=torch.int64, device=raw.device)
    return torch.cat(parts).view(-1, 4).sum(dim=0)


def _launch(words, first: int):
    import torch

    blocks = triton.cdiv(words.numel(), BLOCK)
    out = torch.empty(blocks * 4, dtype=torch.int64, device=words.device)
    _fold_block[(blocks,)](words, words.numel(), first, out, BLOCK=BLOCK)
    return out
