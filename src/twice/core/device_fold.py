"""A tensor's digest on its own device: its bytes folded into 32 bytes by integer sums there.

Copying a large accelerator tensor to the host to hash it costs more than the training step; the
fold runs on the device (NH-style keyed products and keyed XORs, summed modulo 2**64: exact and
order-independent) and only the 32 bytes travel. It runs on the CPU too, so that the algorithm is
checked without a GPU. Imports torch only when called.
"""

from __future__ import annotations

import struct

__all__ = ["device_fold"]

_DEVICE_CHUNK_WORDS = 1 << 24


def _torch():
    import torch

    return torch


def _mix64(x):
    """splitmix64 finaliser on an int64 tensor (wrapping arithmetic, logical shifts emulated)."""

    def shr(v, n):
        return (v >> n) & ((1 << (64 - n)) - 1)

    x = x ^ shr(x, 30)
    x = x * -4658895280553007687  # 0xbf58476d1ce4e5b9 as a signed 64-bit integer
    x = x ^ shr(x, 27)
    x = x * -7723592293110705685  # 0x94d049bb133111eb
    return x ^ shr(x, 31)


def device_fold(tensor) -> bytes:
    """Fold a tensor's bytes into 32 bytes on its own device (integer sums: order-independent,
    exact).

    Works on any device, the CPU included, so that the device algorithm can be checked here.
    """
    torch = _torch()
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    raw = tensor.contiguous().reshape(-1).view(torch.uint8)
    nbytes = raw.numel()
    pad = (-nbytes) % 8
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    words = raw.view(torch.int64)
    low_mask = (1 << 32) - 1
    sums = torch.zeros(4, dtype=torch.int64, device=raw.device)
    for start in range(0, words.numel(), _DEVICE_CHUNK_WORDS):
        chunk = words[start : start + _DEVICE_CHUNK_WORDS]
        index = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=raw.device)
        low, high = chunk & low_mask, (chunk >> 32) & low_mask
        for lane in range(2):
            key = _mix64(index * 2 + lane * (1 << 40) + 0x5EED)
            k_low, k_high = key & low_mask, (key >> 32) & low_mask
            # NH: (a + k1 mod 2^32) * (b + k2 mod 2^32), summed mod 2^64; two lanes with other keys.
            products = ((low + k_low) & low_mask) * ((high + k_high) & low_mask)
            sums[lane] += products.sum()
            sums[2 + lane] += (chunk ^ key).sum()
    return struct.pack("<q", nbytes) + sums.cpu().numpy().astype("<i8").tobytes()
