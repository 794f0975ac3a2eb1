"""PyTorch Distributed Checkpoint's `.metadata` file: its one reader, which runs no code.

DCP pickles its Metadata record (which state lies where in the `__R_N.distcp` files). A pickle
can name any callable; this reader's unpickler resolves only DCP's own metadata records and what
they hold (torch's size, dtypes and layouts, paths, a few builtin containers), so a crafted file
is an error, never code run by `twice checkpoint verify`, by `twice.checkpoint.load` (which
hands DCP this reader's record: checkpoint/sharded.py) or by the comparison of outputs.

The record describes the save itself too: a random UUID that DCP draws at every save (`save_id`)
and the folder it saved to (`checkpoint_id`). Two saves of the same state differ there and
nowhere else; `state_digest` is the digest of the record without them, equal for such saves.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import xxhash

from twice.core.errors import CorruptRecord
from twice.store.reader import read_record

__all__ = ["METADATA", "read", "state_digest", "is_dcp_metadata"]

METADATA = ".metadata"
_MAX_BYTES = 256 << 20  # larger than any DCP metadata of a real model

# The classes a DCP .metadata may name: DCP's own records, and what they hold.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo", "_StoragePrefix"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch": {
        "Size", "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
        "uint8", "bool", "complex64", "complex128", "strided", "sparse_coo", "contiguous_format",
        "channels_last", "preserve_format", "device",
    },
    "torch.serialization": {"_get_layout"},  # a layout by its name, from a fixed table
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}  # fmt: skip


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name not in _ALLOWED.get(module, ()):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
        return super().find_class(module, name)


def read(data: bytes, where: str) -> Any:
    """DCP's Metadata record from the bytes of a `.metadata` file; anything else (a class outside
    DCP's records, a damaged pickle, another object) is a CorruptRecord naming `where`."""
    if len(data) > _MAX_BYTES:
        raise CorruptRecord(f"{where} is larger than any DCP metadata ({len(data)} bytes)")
    try:
        value = _Restricted(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any decoding failure means a damaged file
        raise CorruptRecord(f"{where} is not DCP metadata twice can read: {exc}") from None
    if type(value).__name__ != "Metadata" or not hasattr(value, "state_dict_metadata"):
        raise CorruptRecord(f"{where} is not DCP metadata (it holds a {type(value).__name__})")
    return value


def is_dcp_metadata(path: Path) -> bool:
    """A file DCP's FileSystemWriter names `.metadata`, beside its `.distcp` data files."""
    path = Path(path)
    return path.name == METADATA and any(path.parent.glob("*.distcp"))


def state_digest(path: Path) -> str | None:
    """The digest of the DCP metadata in `path` without what describes the save itself (its
    random save id, its folder); None where it cannot be read as DCP metadata."""
    try:
        value = read(read_record(Path(path)), str(path))
    except (OSError, CorruptRecord):
        return None
    storage = getattr(value, "storage_meta", None)
    if storage is not None:
        storage.save_id = storage.load_id = storage.checkpoint_id = None
    try:
        return xxhash.xxh3_128_hexdigest(pickle.dumps(value, protocol=4))
    except Exception:  # noqa: BLE001 - a record that does not pickle again: no digest
        return None
