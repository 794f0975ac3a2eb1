"""A checkpoint's index (`checkpoint.json`): the typed record, its own digest, and its one reader;
and every name in a checkpoint folder, the folder's own (`step-00000400`) included.

The index says what the folder holds: its entries and their kinds, and the size and digest of each
file (or, for a multi-process checkpoint, the digest of each rank part's index). Everything else
is checked against it, so the index checks itself first: it carries the xxh3 digest of its own
canonical body under `self`, and an index whose body does not match that digest is damaged,
whatever it says. Every name in it is one twice writes: no path in an index leaves its folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import xxhash

from twice.checkpoint.kinds import EntryKind, kind_named
from twice.core.errors import CheckpointError, CorruptRecord
from twice.store import reader
from twice.store.dcpmeta import METADATA as DCP_METADATA

__all__ = [
    "FORMAT",
    "RANKS_FORMAT",
    "INDEX",
    "TENSORS",
    "STATE",
    "FILES",
    "STEP_DIR",
    "PART_DIR",
    "DCP_FOLDER",
    "DCP_FILE",
    "DCP_METADATA",
    "step_name",
    "CheckpointIndex",
    "RanksIndex",
    "read_index",
    "index_bytes",
    "part_name",
]

FORMAT = "twice-checkpoint/2"
RANKS_FORMAT = "twice-checkpoint-ranks/2"
INDEX = "checkpoint.json"
TENSORS = "tensors.safetensors"
STATE = "state.json"
FILES = (TENSORS, STATE)
STEP_DIR = re.compile(r"^step-(\d+)$")  # a checkpoint folder of twice.Run's, by step
PART_DIR = re.compile(r"^rank-(\d{5})$")  # one rank's part of a multi-process checkpoint
DCP_FOLDER = "dcp"  # a sharded checkpoint's Distributed Checkpoint files
# the file names DCP's FileSystemWriter gives: its metadata (DCP's own name, store/dcpmeta.py, which
# reads it below this layer), and each rank's data files
DCP_FILE = re.compile(rf"^({re.escape(DCP_METADATA)}|__\d{{1,5}}_\d{{1,5}}\.distcp)$")
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
_MAX_SIZE = 2**63 - 1
_RESTORE_HINT = (
    "restore an earlier checkpoint (twice.checkpoint.latest skips damaged ones), or re-create it"
)


def step_name(step: int) -> str:
    """The folder name of the checkpoint of `step` (`step-00000400`)."""
    return f"step-{step:08d}"


def part_name(rank: int) -> str:
    """The folder of one rank's part in a multi-process checkpoint."""
    return f"rank-{rank:05d}"


def _self_digest(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return xxhash.xxh3_128_hexdigest(canonical.encode("ascii"))


def index_bytes(body: dict) -> bytes:
    """The index file for `body` (format, entries, files or parts), its own digest added."""
    return json.dumps({**body, "self": _self_digest(body)}, sort_keys=True, indent=2).encode()


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint folder as its index records it."""

    size: int
    digest: str


@dataclass(frozen=True)
class CheckpointIndex:
    """The index of a one-process checkpoint folder: its entries' kinds and its files."""

    entries: dict[str, EntryKind]
    files: dict[str, FileEntry]
    format: str = FORMAT


@dataclass(frozen=True)
class RanksIndex:
    """The index of a multi-process checkpoint: one part per rank, by the digest of its index."""

    world_size: int
    parts: dict[str, str]
    format: str = RANKS_FORMAT
    # the entries saved through DCP (checkpoint/sharded.py) and the files it wrote into dcp/
    sharded_entries: tuple[str, ...] = ()
    sharded_files: dict[str, FileEntry] | None = None


def _damaged(where: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint index {where} is damaged: {what}", _RESTORE_HINT)


def read_index(directory: Path) -> CheckpointIndex | RanksIndex:
    """The validated index of the checkpoint in `directory`; any damage is a CheckpointError."""
    where = Path(directory) / INDEX
    try:
        raw = reader.read_json(where)
    except FileNotFoundError:
        raise CheckpointError(
            f"{directory} is incomplete or not a twice checkpoint: it has no {INDEX}",
            _RESTORE_HINT,
        ) from None
    except CorruptRecord as exc:  # not a regular file, too large, not strict JSON
        raise _damaged(where, exc.message.removeprefix(f"cannot read {where}: ")) from None
    except OSError as exc:
        raise _damaged(where, str(exc)) from None
    if not isinstance(raw, dict):
        raise _damaged(where, "not a JSON object")
    fmt = raw.get("format")
    if fmt not in (FORMAT, RANKS_FORMAT):
        shown = fmt if isinstance(fmt, str) and len(fmt) < 60 else type(fmt).__name__
        raise CheckpointError(
            f"{directory} has an unknown checkpoint format {shown!r}",
            f"this twice reads {FORMAT} and {RANKS_FORMAT}; re-create the checkpoint with it",
        )
    body = {key: value for key, value in raw.items() if key != "self"}
    if raw.get("self") != _self_digest(body):
        raise _damaged(where, "its contents do not match its own digest (it was changed)")
    if fmt == RANKS_FORMAT:
        return _ranks_index(raw, where)
    return _folder_index(raw, where, directory)


def _folder_index(raw: dict, where: Path, directory: Path) -> CheckpointIndex:
    if set(raw) != {"format", "entries", "files", "self"}:
        raise _damaged(
            where, f"expected the keys entries, files, format and self, found {sorted(raw)}"
        )
    entries, files = raw["entries"], raw["files"]
    if not isinstance(entries, dict):
        raise _damaged(where, "'entries' is not an object")
    kinds = {name: kind_named(kind, name, directory.name) for name, kind in entries.items()}
    if not isinstance(files, dict) or set(files) != set(FILES):
        raise _damaged(where, f"'files' must list exactly {', '.join(FILES)}")
    checked = _files(files, where, "files")
    return CheckpointIndex(kinds, checked)


def _ranks_index(raw: dict, where: Path) -> RanksIndex:
    if set(raw) - {"sharded"} != {"format", "world_size", "parts", "self"}:
        raise _damaged(
            where,
            f"expected the keys format, parts, self, world_size (and sharded), found {sorted(raw)}",
        )
    world, parts = raw["world_size"], raw["parts"]
    if type(world) is not int or not 1 <= world <= 99999:
        raise _damaged(where, "'world_size' is not a number of processes")
    if not isinstance(parts, dict) or set(parts) != {part_name(r) for r in range(world)}:
        raise _damaged(where, f"'parts' must name rank-00000 to {part_name(world - 1)}, no other")
    for name, digest in parts.items():
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise _damaged(where, f"'parts.{name}' is not an xxh3 digest")
    if "sharded" not in raw:
        return RanksIndex(world, dict(parts))
    sharded = raw["sharded"]
    if not isinstance(sharded, dict) or set(sharded) != {"entries", "files"}:
        raise _damaged(where, "'sharded' is not an object of entries and files")
    entries, files = sharded["entries"], sharded["files"]
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, str) and e and not e.startswith("__") for e in entries)
        or len(set(entries)) != len(entries)
    ):
        raise _damaged(where, "'sharded.entries' is not a list of distinct entry names")
    if not isinstance(files, dict) or DCP_METADATA not in files:
        raise _damaged(where, "'sharded.files' does not name DCP's .metadata")
    return RanksIndex(
        world,
        dict(parts),
        sharded_entries=tuple(entries),
        sharded_files=_files(files, where, "sharded.files", DCP_FILE),
    )


def _files(files: dict, where: Path, label: str, names: re.Pattern | None = None) -> dict:
    """{name: FileEntry} of an index's `label` object; names outside `names` are damage."""
    checked = {}
    for name, meta in files.items():
        if names is not None and not names.match(name):
            raise _damaged(where, f"'{label}' names {name!r}, not a file DCP writes")
        if (
            not isinstance(meta, dict)
            or set(meta) != {"size", "digest"}
            or type(meta["size"]) is not int
            or not 0 <= meta["size"] <= _MAX_SIZE
            or not isinstance(meta["digest"], str)
            or not _DIGEST.match(meta["digest"])
        ):
            raise _damaged(where, f"'{label}.{name}' is not a size and an xxh3 digest")
        checked[name] = FileEntry(meta["size"], meta["digest"])
    return checked
