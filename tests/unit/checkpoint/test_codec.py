"""Checkpoint state as JSON plus a tensor table: tensors of any dtype back with every bit,
what cannot be saved refused naming where it is."""

import pytest
import torch

from twice import checkpoint
from twice.checkpoint import CheckpointError


def _bits(tensor):
    """The tensor's bytes in logical order: compares dtypes torch.equal has no kernel for."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def test_dtypes_safetensors_cannot_name_round_trip_exactly(tmp_path):
    """complex128 (a physics model's state), complex32 and float8_e8m0fnu have no safetensors dtype:
    they are stored as their bytes, and come back with their dtype, shape and every bit."""
    torch.manual_seed(0)
    values = {
        "c128": torch.randn(3, 2, dtype=torch.complex128),
        "c128_t": torch.randn(3, 4, dtype=torch.complex128).t(),
        "c128_0d": torch.tensor(1 - 2j, dtype=torch.complex128),
        "odd": torch.tensor([1, 2, 3], dtype=torch.uint8),
        "c32": torch.randn(4, dtype=torch.complex64).to(torch.complex32),
        "empty": torch.empty(0, 2, dtype=torch.complex128),
    }
    if hasattr(torch, "float8_e8m0fnu"):
        values["e8m0"] = torch.tensor([0.5, 1.0, 8.0]).to(torch.float8_e8m0fnu)
    back = checkpoint.load(checkpoint.save(tmp_path / "c", extra=values))["extra"]
    for name, value in values.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert torch.equal(_bits(back[name]), _bits(value)), name


def test_a_quantized_tensor_is_refused_naming_where_it_is(tmp_path):
    quantized = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)
    with pytest.raises(
        CheckpointError, match=r"cannot save extra\.q: a quantized tensor"
    ) as refused:
        checkpoint.save(tmp_path / "c", extra={"q": quantized})
    assert "int_repr" in refused.value.hint and not (tmp_path / "c").exists()


def test_state_travels_as_plain_values_and_tensors_and_comes_back_exact():
    """encode_state: for RNG states inside another framework's checkpoint, which refuses NumPy
    arrays and tuples of objects under torch.load(weights_only=True)."""
    import numpy as np

    from twice.checkpoint.codec import decode_state, encode_state

    value = {
        "tuple": (1, "a"),
        "big": 2**80,
        "nan": float("nan"),
        "third": 1 / 3,
        "array": np.arange(5, dtype=np.uint32),
        "tensor": torch.arange(4.0),
        "dtype": torch.bfloat16,
        7: "an int key",
    }
    encoded = encode_state(value)
    plain = (dict, list, str, int, float, bool, type(None), torch.Tensor)

    def walk(item):
        assert isinstance(item, plain), type(item)
        for child in (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        ):
            walk(child)

    walk(encoded)
    back = decode_state(encoded)
    assert back["tuple"] == (1, "a") and back["big"] == 2**80 and back["third"] == 1 / 3
    assert (
        back["nan"] != back["nan"] and back["dtype"] is torch.bfloat16 and back[7] == "an int key"
    )
    assert back["array"].dtype == np.uint32 and back["array"].tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(back["tensor"], torch.arange(4.0))
