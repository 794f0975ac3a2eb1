"""device_fold: a tensor's bytes folded into 32 bytes on its own device (integer sums, exact),
checked here on the CPU, and on CUDA against the CPU; many tensors folded together."""

import pytest
import torch

import twice
from twice.core.device_fold import device_fold
from unit.core.test_digests import DTYPES, sample


def test_the_device_algorithm_is_exact_and_layout_independent_on_the_cpu():
    tensor = torch.randn(1000, 33)
    assert device_fold(tensor) == device_fold(tensor.clone())
    assert device_fold(tensor.t()) == device_fold(tensor.t().contiguous())
    flipped = tensor.clone()
    flipped.view(torch.int32)[500, 7] ^= 1
    assert device_fold(flipped) != device_fold(tensor)
    swapped = tensor.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # same multiset of values, other positions
    assert device_fold(swapped) != device_fold(tensor)


@pytest.mark.parametrize("chunk_words, block_words", [(1 << 24, 1 << 12), (64, 8), (16, 16)])
def test_many_tensors_folded_together_give_each_ones_own_fold(
    monkeypatch, chunk_words, block_words
):
    """The trace's batched device path: small chunks and blocks put tensors in several groups,
    split tensors over many blocks and send large ones down the one-tensor path."""
    from twice.core import device_fold as module

    monkeypatch.setattr(module, "DEVICE_CHUNK_WORDS", chunk_words)
    monkeypatch.setattr(module, "BLOCK_WORDS", block_words)
    generator = torch.Generator().manual_seed(0)
    tensors = [sample(dtype) for dtype in DTYPES] + [
        torch.zeros(0),
        torch.randn(3, generator=generator),
        torch.randn(100, 37, generator=generator).t(),
        torch.randn(4097, generator=generator, dtype=torch.float64),
        torch.randint(0, 255, (1000 * 8 + 5,), generator=generator, dtype=torch.uint8),
    ]
    many = module.device_fold_many(tensors)
    assert many == [device_fold(t) for t in tensors]
    assert len(set(many[-5:])) == 5  # and not one value for all (the samples share bytes)


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: no CUDA device on this machine"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_digest_is_computed_on_the_device_and_matches_the_device_algorithm_on_the_cpu(dtype):
    tensor = sample(dtype)
    assert device_fold(tensor.cuda()) == device_fold(tensor)
    assert twice.digest(tensor.cuda()) == twice.digest(tensor.cuda().clone())


def test_the_device_fold_reads_a_view_that_starts_inside_a_word():
    """x[1:] of a float32 tensor starts 4 bytes into a word: its fold is that of its copy (it
    raised before, on any device)."""
    base = torch.arange(11, dtype=torch.float32)
    assert device_fold(base[1:]) == device_fold(base[1:].clone())
    assert device_fold(base[3:]) != device_fold(base[1:])
