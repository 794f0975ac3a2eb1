import collections
import dataclasses
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import twice

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.complex64,
    torch.complex128,
]


def sample(dtype, shape=(3, 5)):
    base = torch.arange(15, dtype=torch.float32).reshape(shape) / 7 - 1
    if dtype is torch.bool:
        return base > 0
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    return base.mul(10).to(dtype) if not dtype.is_floating_point else base.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dense_dtype_digests_and_a_changed_element_changes_the_digest(dtype):
    tensor = sample(dtype)
    assert twice.digest(tensor) == twice.digest(tensor.clone())
    changed = tensor.clone()
    changed.view(torch.uint8).view(-1)[0] ^= 1  # flip one bit of the first element
    assert twice.digest(changed) != twice.digest(tensor)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views_and_non_contiguous_tensors_digest_like_their_contiguous_copies(dtype):
    tensor = sample(dtype)
    transposed = tensor.t()
    assert not transposed.is_contiguous()
    assert twice.digest(transposed) == twice.digest(transposed.contiguous())
    assert twice.digest(tensor[:, ::2]) == twice.digest(tensor[:, ::2].clone())
    assert twice.digest(tensor[1]) == twice.digest(tensor[1].clone())


def test_dtype_and_shape_are_part_of_the_digest():
    data = torch.zeros(4, dtype=torch.int32)
    assert twice.digest(data) != twice.digest(data.view(torch.float32))
    assert twice.digest(data) != twice.digest(data.reshape(2, 2))
    assert twice.digest(torch.tensor(0.0)) != twice.digest(torch.tensor(-0.0))


def test_conjugate_and_negative_views_digest_their_values():
    z = torch.complex(torch.ones(3), torch.arange(3.0))
    assert twice.digest(z.conj()) == twice.digest(z.conj().resolve_conj())


def test_nested_batches_state_dicts_and_dataclasses():
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        label: str

    model = torch.nn.Linear(3, 2)
    assert twice.digest(model.state_dict()) == twice.digest(
        {k: v.clone() for k, v in model.state_dict().items()}
    )
    nested = {
        "a": [torch.ones(2), (1, 2.5, "s", None, b"by")],
        "b": Batch(torch.zeros(1), "l"),
        "n": np.arange(3),
    }
    same = {
        "a": [torch.ones(2), (1, 2.5, "s", None, b"by")],
        "b": Batch(torch.zeros(1), "l"),
        "n": np.arange(3),
    }
    assert twice.digest(nested) == twice.digest(same)
    assert twice.digest([1, 2]) != twice.digest((1, 2))
    assert twice.digest([torch.ones(2)]) != twice.digest([torch.ones(2), torch.ones(0)])
    assert twice.digest(1) != twice.digest(1.0) != twice.digest("1")


def test_unknown_objects_are_refused_unless_strict_is_off():
    with pytest.raises(TypeError, match="cannot digest"):
        twice.digest(object())
    assert len(twice.digest(object(), strict=False)) == 32


def test_a_layout_without_readable_parts_is_refused_with_a_fix():
    """Sparse layouts are digested (tests/e2e/test_capture.py); an opaque one such as MKL-DNN's is
    not."""
    with pytest.raises(TypeError, match="to_dense"):
        twice.digest(torch.randn(3, 4).to_mkldnn())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, width=32), min_size=1, max_size=40), st.integers(0, 39))
def test_a_single_changed_bit_anywhere_changes_the_digest(values, index):
    tensor = torch.tensor(values, dtype=torch.float32)
    index %= tensor.numel()
    flipped = tensor.clone()
    flipped.view(torch.int32)[index] ^= 1 << (index % 32)
    assert twice.digest(flipped) != twice.digest(tensor)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_fast_tensor_digest_gives_exactly_digests_value(dtype):
    from twice.core.digests import digest_tensor

    for tensor in (
        sample(dtype),
        sample(dtype).t(),
        sample(dtype)[:0],
        sample(dtype)[1, 2],
        sample(dtype).reshape(-1)[::2],
    ):
        assert digest_tensor(tensor) == twice.digest(tensor)
    changed = sample(dtype).clone()
    changed.view(-1)[4] = changed.view(-1)[14]  # a different value in every dtype here
    assert digest_tensor(changed) != digest_tensor(sample(dtype))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_fast_digests_hand_compressed_layouts_to_digest():
    """digest_tensor and digest_many (the step trace's) read a tensor's layout before asking whether
    it is contiguous, which a compressed layout cannot answer."""
    from twice.core.digests import digest_tensor
    from twice.core.fastpath import digest_many

    dense = torch.arange(12.0).reshape(3, 4)
    for tensor in (dense.to_sparse_csr(), dense.to_sparse_csc(), dense.to_sparse()):
        assert digest_tensor(tensor) == twice.digest(tensor)
        assert digest_many([tensor, dense])[0] == [twice.digest(tensor), twice.digest(dense)]


def test_batch_digests_are_stable_across_versions():
    """The step trace digests every batch read (lenient Digester): traces recorded by an earlier
    twice must compare with new ones, whichever path frames the batch. These values are fixed:
    tuples and lists of plain tensors (the usual batch, framed from a cached head), a lone tensor,
    a view, a tuple subclass with keys() (a mapping, as it always was), a namedtuple, nested and
    sparse tensors, a mixture."""
    from twice.core.digests import Digester

    grid = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    labels = torch.tensor([3, 1])

    class Keyed(tuple):
        def keys(self):
            return ["a"]

        def __getitem__(self, key):
            return 7 if key == "a" else tuple.__getitem__(self, key)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        nested = torch.nested.nested_tensor(
            [torch.arange(6.0).reshape(2, 3), torch.arange(3.0).reshape(1, 3)]
        )
    pair = collections.namedtuple("Pair", "x y")
    # (batch, digest): a list, since equal tuples of the same tensors would share a dict key
    expected = [
        ((grid, labels), "559731a75d0428be0f749cc5aeff76ee"),
        ([grid, labels], "42d57ba1608562b54a75af221e9695ea"),
        (grid, "98f875d41e3faf7a1ddf52f01778153e"),
        ((grid.transpose(1, 2), labels), "8d86a3a96532bfc2b51b7bfefb9d6433"),
        (Keyed((grid,)), "f313ad03b7471bef13932de9478a2353"),
        (pair(grid, labels), "54e7eb29f6967680a3ccb284064ec2e2"),
        ((nested, labels), "a59527e705d4d01a1051c1ca8750cf10"),
        ((grid.to_sparse(), labels), "d0861654eff33b8ec819c8bc3a04ca49"),
        ([(grid, 2), {"y": labels}, "s"], "2e026309f76ef9ad2e7c0d739f2dfc73"),
    ]
    for batch, value in expected:
        assert Digester(strict=False).update(batch).hexdigest() == value, batch
    assert Digester(strict=False).update((grid, labels + 1)).hexdigest() != expected[0][1]


def test_digest_values_are_stable_across_versions():
    """Traces recorded by an earlier twice must compare with new ones: these values are fixed."""
    from twice.core.digests import digest_bytes

    grid = torch.arange(6, dtype=torch.float32)
    assert twice.digest(grid.reshape(2, 3)) == "84668e35caac6220218ec0250bd22504"
    assert twice.digest(grid.reshape(3, 2).t()) == "96d742316051f32a10c4e46a8254919a"
    assert twice.digest((torch.tensor([1, 2]), 3, "x")) == "eda0bf28eac95edadaafe8bda24b01ff"
    assert twice.digest(b"twice") == digest_bytes(b"twice") == "d5c6321f2d7f6926ba6fdd5517e2e164"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantized_tensors_digest_their_integers_with_their_scales():
    """Two quantized tensors can hold the same integers under different scales: different values."""
    from twice.core.digests import digest_tensor

    values = torch.tensor([0.5, 1.0, -1.0])
    a = torch.quantize_per_tensor(values, 0.1, 0, torch.qint8)
    b = torch.quantize_per_tensor(values * 2, 0.2, 0, torch.qint8)
    assert torch.equal(a.int_repr(), b.int_repr())
    assert twice.digest(a) != twice.digest(b) and digest_tensor(a) == twice.digest(
        a
    ) != digest_tensor(b)
    assert twice.digest(a) == twice.digest(
        torch.quantize_per_tensor(values.clone(), 0.1, 0, torch.qint8)
    )
    assert twice.digest(a) != twice.digest(
        torch.quantize_per_tensor(values, 0.1, 1, torch.qint8)
    )  # zero point
    weights = torch.randn(2, 3)
    per_channel = torch.quantize_per_channel(
        weights, torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.quint8
    )
    other_scales = torch.quantize_per_channel(
        weights, torch.tensor([0.1, 0.25]), torch.tensor([0, 1]), 0, torch.quint8
    )
    assert (
        twice.digest(per_channel) == twice.digest(per_channel.clone()) != twice.digest(other_scales)
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nested_tensors_digest_their_components_in_order():
    """Variable-length batches (torch.nested) digest as their components, in order, under their
    layout."""

    def nested(*lengths, layout=torch.strided):
        return torch.nested.nested_tensor(
            [torch.arange(n, dtype=torch.float32) for n in lengths], layout=layout
        )

    assert twice.digest(nested(2, 3)) == twice.digest(nested(2, 3))
    assert (
        len(
            {
                twice.digest(nested(2, 3)),
                twice.digest(nested(3, 2)),
                twice.digest(nested(2, 3, layout=torch.jagged)),
                twice.digest([torch.arange(2.0), torch.arange(3.0)]),
            }
        )
        == 4
    )


def test_a_torch_or_numpy_still_being_imported_by_another_thread_does_not_break_a_digest():
    """While one thread imports torch, `sys.modules` holds a module without `Tensor` yet; a digest
    taken in another thread then (the launcher's segment checks do) sees no tensor type at all."""
    code = (
        "import sys, types\n"
        "from twice.core.digests import digest\n"
        "plain = digest([b'x', 1, 'y'])\n"
        "sys.modules['torch'] = types.ModuleType('torch')\n"
        "sys.modules['numpy'] = types.ModuleType('numpy')\n"
        "print(digest([b'x', 1, 'y']) == plain)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "True\n", result.stderr
