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
def _lane_sums(word, index, inside, lane: tl.constexpr):
    # one lane's two sums over a block's words (padding masked out): NH's keyed products, and the
    # keyed XORs, each summed modulo 2**64
    key = _mix64(index * 2 + (lane * (1 << 40) + 0x5EED))
    low = word & 0xFFFFFFFF
    high = word >> 32
    product = ((low + (key & 0xFFFFFFFF)) & 0xFFFFFFFF) * ((high + (key >> 32)) & 0xFFFFFFFF)
    nothing = tl.zeros_like(product)
    product_sum = tl.sum(tl.where(inside, product, nothing), axis=0)
    xor_sum = tl.sum(tl.where(inside, word ^ key, nothing), axis=0)
    return product_sum.to(tl.int64, bitcast=True), xor_sum.to(tl.int64, bitcast=True)


@triton.jit
def _fold_block(words, n, first, out, BLOCK: tl.constexpr):
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    word = tl.load(words + offsets, mask=inside, other=0).to(tl.uint64, bitcast=True)
    index = (offsets + first).to(tl.uint64)
    for lane in tl.static_range(2):
        product_sum, xor_sum = _lane_sums(word, index, inside, lane)
        tl.store(out + block * 4 + lane, product_sum)
        tl.store(out + block * 4 + 2 + lane, xor_sum)


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


@triton.jit
def _fold_table(base, offsets, firsts, counts, owners, out, BLOCK: tl.constexpr):
    # One program per block of a table of blocks over many tensors, each read where it lies: the
    # block's words start `offset` words from `base` (another tensor's memory, reached by pointer
    # arithmetic), are the tensor's words `first`.. (`count` of them), and their four sums go to
    # row `owner` of `out`, added atomically (integer sums modulo 2**64: any order, same bits).
    block = tl.program_id(0)
    offset = tl.load(offsets + block)
    first = tl.load(firsts + block)
    count = tl.load(counts + block)
    owner = tl.load(owners + block)
    lanes = tl.arange(0, BLOCK)
    inside = lanes < count
    word = tl.load(base + offset + lanes, mask=inside, other=0).to(tl.uint64, bitcast=True)
    index = (first + lanes).to(tl.uint64)
    for lane in tl.static_range(2):
        product_sum, xor_sum = _lane_sums(word, index, inside, lane)
        tl.atomic_add(out + owner * 4 + lane, product_sum)
        tl.atomic_add(out + owner * 4 + 2 + lane, xor_sum)


def fold_many(raws: list, keep: list):
    """device_fold's four sums of each 1-d uint8 tensor of `raws` (one device), as an int64
    (len(raws), 4) tensor on that device, from one kernel launch over all of them: each is read
    where it lies (a tensor whose address or size is not a whole number of words is copied to
    one that is, zero-padded). Nothing waits for the device. `keep` receives what must stay alive
    until the kernel has run (the staged copies and the block table)."""
    import numpy as np
    import torch

    device = raws[0].device
    words = []
    for raw in raws:
        if raw.data_ptr() % 8 or raw.storage_offset() % 8 or raw.numel() % 8:  # staged, padded
            staged = torch.zeros(-(-raw.numel() // 8), dtype=torch.int64, device=device)
            staged.view(torch.uint8)[: raw.numel()].copy_(raw)
            words.append(staged)
        else:
            words.append(raw.view(torch.int64))
    keep.extend(words)
    out = torch.zeros((len(raws), 4), dtype=torch.int64, device=device)
    sizes = np.array([w.numel() for w in words], dtype=np.int64)
    if not sizes.any():
        return out
    addresses = np.array([w.data_ptr() for w in words], dtype=np.int64)
    base = words[int(addresses.argmin())]
    blocks = -(-sizes // BLOCK)  # a tensor of no words has no block: its sums stay zero
    owners = np.repeat(np.arange(len(words), dtype=np.int64), blocks)
    starts = np.repeat(np.cumsum(blocks) - blocks, blocks)
    firsts = (np.arange(len(owners), dtype=np.int64) - starts) * BLOCK
    counts = np.minimum(BLOCK, sizes[owners] - firsts)
    offsets = (addresses[owners] - base.data_ptr()) // 8 + firsts
    table = torch.from_numpy(np.stack([offsets, firsts, counts, owners]))
    if device.type == "cuda":  # from pinned memory: the copy does not wait for the device
        table = table.pin_memory().to(device, non_blocking=True)
    keep.append(table)
    _fold_table[(len(owners),)](base, table[0], table[1], table[2], table[3], out, BLOCK=BLOCK)
    return out
