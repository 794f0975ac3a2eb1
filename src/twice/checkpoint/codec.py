"""Checkpoint state as JSON plus a flat tensor table: nested values, exact floats, tensors of any
dtype.

Tensors go to the safetensors file by key (`{"__tensor__": "t3"}`); integers beyond 2**53 and
non-finite floats are tagged so that they come back exact; NumPy arrays, sparse tensors and dtypes
safetensors has no name for are stored as bytes with their dtype and shape beside them.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import numpy as np

from twice.core.errors import CheckpointError

__all__ = ["encode", "decode", "encode_state", "decode_state", "safetensors_dtypes"]


@functools.cache
def safetensors_dtypes() -> dict:
    """torch dtype -> the name safetensors writes it under (dtypes without one are stored as
    bytes)."""
    from safetensors.torch import _TYPES

    return {dtype: name for name, dtype in _TYPES.items()}


def encode(value: Any, tensors: dict, path: str) -> Any:
    """`value` as JSON, its tensors moved into `tensors` by key; `path` names it in errors."""
    import torch

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -(2**53) <= value <= 2**53 else {"__int__": str(value)}
    if isinstance(value, float):
        return (
            value
            if value == value and abs(value) != float("inf")
            else {"__float__": float.hex(value)}
        )
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return _encode_sparse(value, tensors, path)
        if value.is_quantized:
            raise CheckpointError(
                f"cannot save {path}: a quantized tensor",
                "save its int_repr(), q_scale() and q_zero_point(), or the float model before "
                "quantization",
            )
        key = f"t{len(tensors)}"
        if value.dtype in safetensors_dtypes():
            tensors[key] = value
            return {"__tensor__": key}
        # A dtype safetensors has no name for (complex128, complex32, newer float8 and float4
        # kinds): its bytes as a uint8 tensor, the dtype and shape beside them in the JSON.
        name = str(value.dtype).removeprefix("torch.")
        try:
            raw = value.detach().reshape(-1).contiguous().view(torch.uint8)
        except RuntimeError as exc:
            raise CheckpointError(
                f"cannot save {path}: its dtype {name} cannot be stored as bytes ({exc})",
                "convert it to a standard dtype first",
            ) from exc
        tensors[key] = raw
        return {"__bytes_tensor__": {"key": key, "dtype": name, "shape": list(value.shape)}}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError(
                f"cannot save {path}: a NumPy array of Python objects", "store plain numeric arrays"
            )
        data = np.ascontiguousarray(value)
        return {
            "__ndarray__": {
                "dtype": data.dtype.str,
                "shape": list(data.shape),
                "data": base64.b64encode(data.tobytes()).decode("ascii"),
            }
        }
    if isinstance(value, np.generic):
        return encode(value.item(), tensors, path)
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(
            k.startswith("__") and k.endswith("__") for k in value
        ):
            # In key order, as state.json lists them: tensor keys then follow the content, not
            # the order the dict was filled in (Adam fills 'step' first; a loaded state has it
            # last), so a resumed run saves the same bytes as the straight one.
            return {k: encode(value[k], tensors, f"{path}.{k}") for k in sorted(value)}
        return {
            "__items__": [
                [encode(k, tensors, path), encode(v, tensors, f"{path}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    raise CheckpointError(
        f"cannot save {path}: a {type(value).__module__}.{type(value).__qualname__} is neither "
        "a tensor, a number, a string nor a list/tuple/dict of those",
        "give it a state_dict()/load_state_dict() pair, or store it as plain data",
    )


def _encode_sparse(value: Any, tensors: dict, path: str) -> dict:
    """A sparse tensor (SGD's momentum buffer for sparse gradients) as its index and value
    tensors."""
    from twice.core.digests import sparse_parts

    parts = sparse_parts(value)
    if parts is None:
        raise CheckpointError(
            f"cannot save {path}: a {value.layout} tensor", "convert it with .to_dense() first"
        )
    layout = str(value.layout).removeprefix("torch.")
    names = ("indices", "values") if layout == "sparse_coo" else ("compressed", "plain", "values")
    body = {
        name: encode(part.detach(), tensors, f"{path}.{name}") for name, part in zip(names, parts)
    }
    if layout == "sparse_coo":
        body["coalesced"] = value.is_coalesced()
    return {"__sparse__": {"layout": layout, "size": list(value.shape), **body}}


def _decode_sparse(body: dict, tensors: dict) -> Any:
    import torch

    parts = {
        name: decode(part, tensors) for name, part in body.items() if name not in ("layout", "size")
    }
    size = body["size"]
    if not (isinstance(size, list) and all(type(n) is int and 0 <= n < 2**62 for n in size)):
        raise ValueError(f"a sparse tensor's size is not a list of sizes: {str(size)[:40]}")
    # PyTorch's own invariant checks: indices inside the shape, sorted compressed indices. Without
    # them a crafted folder gives a tensor whose .to_dense() writes out of bounds.
    if body["layout"] == "sparse_coo":
        if type(parts.get("coalesced")) is not bool:
            raise ValueError("a sparse tensor's 'coalesced' is not true or false")
        value = torch.sparse_coo_tensor(
            parts["indices"],
            parts["values"],
            size,
            is_coalesced=parts["coalesced"],
            check_invariants=True,
        )
        if parts["coalesced"] and not torch.equal(value._indices(), value.coalesce()._indices()):
            raise ValueError("a sparse tensor marked coalesced is not")
        return value
    return torch.sparse_compressed_tensor(
        parts["compressed"],
        parts["plain"],
        parts["values"],
        size,
        layout=_layout(body["layout"]),
        check_invariants=True,
    )


def _layout(name: Any) -> Any:
    import torch

    layout = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(layout, torch.layout):
        raise CheckpointError(
            f"a sparse tensor in this checkpoint names the layout {str(name)[:40]!r}, unknown to "
            "torch",
            "the checkpoint is damaged or crafted, or needs the torch version that saved it",
        )
    return layout


def decode(value: Any, tensors: dict) -> Any:
    """The value `encode` was given, its tensors taken from `tensors`."""
    import torch

    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "__tensor__":
            return tensors[body]
        if tag == "__bytes_tensor__":
            dtype = getattr(torch, body["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise CheckpointError(
                    f"a tensor in this checkpoint has dtype {body['dtype']}, unknown to torch "
                    f"{torch.__version__}",
                    "load it with the torch version that saved it",
                )
            return tensors[body["key"]].view(dtype).reshape(body["shape"])
        if tag == "__tuple__":
            return tuple(decode(v, tensors) for v in body)
        if tag == "__items__":
            return {decode(k, tensors): decode(v, tensors) for k, v in body}
        if tag == "__int__":
            return int(body)
        if tag == "__float__":
            return float.fromhex(body)
        if tag == "__ndarray__":
            raw = base64.b64decode(body["data"])
            return np.frombuffer(raw, dtype=np.dtype(body["dtype"])).reshape(body["shape"]).copy()
        if tag == "__dtype__":
            dtype = getattr(torch, body, None) if isinstance(body, str) else None
            if not isinstance(dtype, torch.dtype):
                raise CheckpointError(
                    f"a value in this checkpoint names the dtype {str(body)[:40]!r}, which torch "
                    f"{torch.__version__} does not have",
                    "the checkpoint is damaged or crafted, or needs the torch that saved it",
                )
            return dtype
        if tag == "__sparse__":
            return _decode_sparse(body, tensors)
    return {k: decode(v, tensors) for k, v in value.items()}


def encode_state(value: Any) -> dict:
    """`value` (RNG states, nested numbers, arrays, tensors) as plain dicts, lists, numbers and
    tensors.

    For state that travels inside another framework's checkpoint (Lightning, the Hugging Face
    Trainer): it survives torch.load(weights_only=True), which refuses NumPy arrays and tuples of
    arbitrary objects."""
    tensors: dict = {}
    return {"state": encode(value, tensors, "state"), "tensors": tensors}


def decode_state(encoded: dict) -> Any:
    """The value `encode_state` was given."""
    return decode(encoded["state"], encoded["tensors"])
