"""Random numbers from a counter-based generator (Philox-4x32-10): the same numbers on every CPU,
thread count and device.

torch's CPU generator gives the same integers everywhere, but turns them into floats with
vectorised code that rounds differently per instruction set (`randn`, `normal_`, `uniform_` change
under ATEN_CPU_CAPABILITY), and CUDA has another generator altogether. In portable mode every
random operation draws one 64-bit key from torch's own generator (the one it was given, or the
default CPU generator), so `torch.manual_seed`, `get_rng_state` and checkpoints keep working, and
then computes element i from Philox(key, counter=i) with integer operations and IEEE arithmetic
only. Floats: a uniform from the top 53 bits of two words; normals by Box-Muller with twice's own
log and sine (elementwise.py).
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.arithmetic import elementwise as ew

__all__ = [
    "philox",
    "philox_words",
    "integers",
    "draw_key",
    "uniform",
    "normal",
    "random_bits",
    "randperm",
]

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def philox(counter: torch.Tensor, key: int, rounds: int = 10) -> list[torch.Tensor]:
    """Philox-4x32 of 64-bit counters (int64 tensor; the two high words are zero) under a 64-bit
    key: four int64 tensors of 32-bit words."""
    zero = torch.zeros_like(counter)
    return philox_words([counter & _MASK, (counter >> 32) & _MASK, zero, zero], key, rounds)


def philox_words(words: list[torch.Tensor], key: int, rounds: int = 10) -> list[torch.Tensor]:
    """Philox-4x32-`rounds` of four int64 tensors of 32-bit counter words under a 64-bit key."""
    c0, c1, c2, c3 = words
    k0, k1 = key & _MASK, (key >> 32) & _MASK
    for index in range(rounds):
        p0 = c0 * _M0  # 64-bit products: int64 keeps their low 64 bits, all we need
        p1 = c2 * _M1
        hi0, lo0 = (p0 >> 32) & _MASK, p0 & _MASK
        hi1, lo1 = (p1 >> 32) & _MASK, p1 & _MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if index + 1 < rounds:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return [c0, c1, c2, c3]


def draw_key(generator: torch.Generator | None = None) -> int:
    """A fresh 64-bit key from torch's generator (the default CPU one when None)."""
    gen = generator if generator is not None and generator.device.type == "cpu" else None
    word = torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, generator=gen)
    return int(word) & 0xFFFFFFFFFFFFFFFF


def random_bits(count: int, key: int, device=None) -> list[torch.Tensor]:
    """At least `count` 32-bit words per lane: four lanes of ceil(count/4) words each."""
    lanes = max(1, -(-count // 4))
    return philox(torch.arange(lanes, dtype=torch.int64, device=device), key)


def _words(count: int, key: int, device) -> torch.Tensor:
    """`count` 64-bit integers of 53 random bits, element i from the counters of group i."""
    groups = max(1, -(-count // 2))
    w = philox(torch.arange(groups, dtype=torch.int64, device=device), key)
    first = (w[0] << 21) ^ (w[1] >> 11)
    second = (w[2] << 21) ^ (w[3] >> 11)
    return torch.stack([first, second], dim=1).reshape(-1)[:count]


def uniform(count: int, key: int, device=None) -> torch.Tensor:
    """`count` float64 uniforms in [0, 1): k * 2**-53 for 53-bit integers k."""
    if (out := native.uniform(count, key, device)) is not None:
        return out
    if (out := native.gpu_uniform(count, key, device)) is not None:
        return out
    return _words(count, key, device).to(torch.float64) * (2.0**-53)


def normal(count: int, key: int, device=None) -> torch.Tensor:
    """`count` float64 standard normals, Box-Muller on pairs of uniforms."""
    if (out := native.normal(count, key, device)) is not None:
        return out
    pairs = max(1, -(-count // 2))
    u = uniform(2 * pairs, key, device).view(pairs, 2)
    radius = ew.sqrt(ew.log(1.0 - u[:, 0]) * -2.0)  # 1 - u in (0, 1]: no log(0)
    sin, cos = ew.sincos_turns(u[:, 1])
    return torch.stack([radius * cos, radius * sin], dim=1).reshape(-1)[:count]


def randperm(n: int, key: int, device=None) -> torch.Tensor:
    """A permutation of range(n): the order of n random 53-bit keys (ties by index)."""
    keys = _words(n, key, device)
    return torch.sort(keys, stable=True).indices


def integers(count: int, key: int, device=None) -> torch.Tensor:
    """`count` non-negative 63-bit integers (int64), element i from the counters of group i."""
    w = philox(torch.arange(max(1, count), dtype=torch.int64, device=device), key)
    return ((w[0] << 31) | (w[1] >> 1))[:count]
