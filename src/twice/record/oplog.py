"""Op-level recording of chosen steps: every ATen operation with digests of its inputs and outputs.

A TorchDispatchMode sees each operation of forward, backward and the optimizer update below
autograd. For each one we record its name, the phase, the module path ("encoder.layers.3.attn"),
the user's source line, and digests of inputs (before the op: in-place ops change them) and
outputs; output values are kept too (up to a budget) so that a difference can be measured. Only
recorded steps pay for this; other steps run without the mode.
"""

from __future__ import annotations

import json
import sys
import types
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from twice.core.digests import digest_tensor
from twice.record.callsite import line_from_traceback, module_names, user_line
from twice.record.opargs import op_scalars as _scalars
from twice.record.opargs import op_tensors as _tensors
from twice.store.layout import RunFolder

__all__ = ["OpContext", "OpLog", "OpRecorder"]


def _compiled_anything() -> bool:
    """Whether torch.compile has compiled a frame in this process (torch._dynamo counts them)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return False
    try:
        return bool(counters["frames"].get("total", 0))
    except Exception:  # a torch whose counters look different: keep the safe wrapper
        return True


class OpContext(TorchDispatchMode):
    """A dispatch mode that knows, for each op, its phase, module path and the user's source line.

    Subclasses implement `on_op`. `phase` is set by the step recorder's hooks (forward, backward,
    user: between backward and the optimizer step, optimizer).
    """

    def __init__(self, step: int, forward_lines: bool = True, short_lived: bool = False):
        super().__init__()
        self.step = step
        self.forward_lines = forward_lines
        self.phase = "forward"
        self._step_line: str | None = None  # the user's line calling optimizer.step(), while in it
        self.step_line_shared = (
            False  # while a torch.optim optimizer steps: its ops share the line calling step()
        )
        self.paused = False
        self._module_stack: list[str] = []
        self._names = (
            _NAMES  # shared across steps: the gc walk is only repeated for unknown modules
        )
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
            torch.nn.modules.module.register_module_forward_hook(self._leave_module),
        ]
        # Forward ops whose autograd nodes still have to be labelled with their source line: a
        # dispatch mode runs below autograd, so an output gets its grad_fn only after the op
        # returns; the label is put on at the next op (the line a backward op came from). Anomaly
        # mode would store a whole traceback per node instead, ~10x the cost.
        self._unlabelled: list[tuple[list, str]] = []
        if short_lived and not _compiled_anything():
            # TorchDispatchMode wraps __torch_dispatch__ so that torch.compile never traces into
            # it, at ~5 us per op. Nothing has been compiled in this process, so there is no
            # compiler to keep out: call the method directly (an instance attribute wins the
            # lookup).
            # Only for a mode that lives one step (the op log): one that watches a whole run (the
            # numerics watch) keeps the guard, since the program may compile something later.
            raw = getattr(type(self).__torch_dispatch__, "__wrapped__", None)
            if raw is not None:
                self.__torch_dispatch__ = types.MethodType(raw, self)

    def set_phase(self, phase: str, step_line_shared: bool = False) -> None:
        """Enter a phase; a new phase (or a new optimizer step) finds its user line again."""
        self.phase, self.step_line_shared, self._step_line = phase, step_line_shared, None

    def _enter_module(self, module, args):
        entry = self._names.get(id(module))
        if entry is None or entry[0]() is not module:  # unknown, or a freed module's address reused
            self._names.clear()
            self._names.update(module_names())
            entry = self._names.setdefault(id(module), (weakref.ref(module), type(module).__name__))
        name = entry[1]
        if self.phase in ("user", "optimizer"):
            self.phase = "forward"  # the next forward pass has begun
        self._module_stack.append(name)

    def _leave_module(self, module, args, output):
        name = self._module_stack.pop() if self._module_stack else type(module).__name__
        # Label the autograd nodes this module created, so its backward ops can be named.
        pending = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        seen = set()
        while pending:
            node = pending.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            metadata = node.metadata
            if "twice_module" in metadata:
                continue  # created by an inner module (labelled first) or before this step
            metadata["twice_module"] = name
            pending.extend(next_node for next_node, _ in node.next_functions)

    def close(self) -> None:
        """Release what the mode keeps between operations."""
        for hook in self._hooks:
            hook.remove()
        self._label_nodes()

    def remember_line(self, outputs: list, line: str | None) -> None:
        """Label the autograd nodes that will be created for `outputs` with `line` (see
        __init__)."""
        if self.forward_lines and line is not None and outputs:
            self._unlabelled.append((outputs, line))

    def _label_nodes(self) -> None:
        pending, self._unlabelled = self._unlabelled, []
        for outputs, line in pending:
            for tensor in outputs:
                node = tensor.grad_fn
                if node is not None and "twice_line" not in node.metadata:
                    node.metadata["twice_line"] = line

    def where(self) -> dict:
        """Phase, module, line (and autograd node) of the op being dispatched now."""
        if self._unlabelled:
            self._label_nodes()
        node = torch._C._current_autograd_node()
        if node is not None:
            metadata = node.metadata
            line = None
            if self.forward_lines:
                line = metadata.get("twice_line") or line_from_traceback(metadata.get("traceback_"))
            return {
                "phase": "backward",
                "module": metadata.get("twice_module"),
                "node": node.name(),
                "line": line or user_line(),
            }
        phase = self.phase
        if phase == "optimizer" and self.step_line_shared:
            # Every op of torch.optim's step() comes from the one line that called it: found once.
            line = self._step_line
            if line is None:
                line = self._step_line = user_line()
            return {
                "phase": phase,
                "module": self._module_stack[-1] if self._module_stack else None,
                "line": line,
            }
        self._step_line = None
        return {
            "phase": phase,
            "module": self._module_stack[-1] if self._module_stack else None,
            "line": user_line(),
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        skip = _SKIP.get(func)
        if skip is None:
            skip = _SKIP[func] = func.is_view or func in _SKIPPED or func.namespace == "profiler"
        if skip or self.paused:
            return func(*args, **kwargs)
        return self.on_op(func, args, kwargs)

    def on_op(self, func, args, kwargs):
        """Called for each operation the mode sees (subclasses record or check it)."""
        return func(*args, **kwargs)


class OpRecorder(OpContext):
    """Records every operation of one step (see the module docstring)."""

    def __init__(self, step: int, dump_index: int | None = None):
        super().__init__(step, short_lived=True)
        self.records: list[dict] = []
        self.values: dict[str, torch.Tensor] = {}
        self.dump_index = dump_index
        # id -> (weak reference, version, digest): a tensor digested once is not hashed again while
        # its version counter (bumped by every in-place write) is unchanged. The weak reference
        # tells a live tensor from a later one given the same id, without keeping every
        # intermediate of the step alive (holding them made each op's output land in fresh,
        # page-faulting memory instead of memory the allocator had just freed).
        self._digests: dict[int, tuple[Any, int, str]] = {}

    def on_op(self, func, args, kwargs):
        """Record one operation: its name, module, line and the digests of its inputs and
        outputs."""
        op_digest = self.op_digest
        inputs = [
            op_digest(t) for t in (_tensors(args) + _tensors(kwargs) if kwargs else _tensors(args))
        ]
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        index = len(self.records)
        record = {
            "i": index,
            "op": func.name(),
            "phase": self.phase,
            "in": inputs,
            "out": [op_digest(t) for t in outputs],
            "shapes": [list(t.shape) for t in outputs],
            "dtypes": [_dtype_name(t.dtype) for t in outputs],
        }
        scalars = _scalars(args, kwargs)
        if scalars:  # a learning rate, an alpha: part of what the op was given
            record["sc"] = scalars
        record.update(self.where())
        if record["phase"] != "backward":
            self.remember_line(outputs, record["line"])
        self.records.append(record)
        if index == self.dump_index:
            # Asked for by `twice locate` once it knows which op differs: its outputs and inputs.
            for j, tensor in enumerate(outputs):
                self.values[f"{index}.{j}"] = tensor.detach().to("cpu", copy=True).contiguous()
        return out

    def digest(self, tensor: torch.Tensor) -> str:
        """`digest_tensor(tensor)`, hashed once per tensor version within the step."""
        return self._cached(id(tensor), tensor, digest_tensor)

    def _cached(self, key: int, tensor: torch.Tensor, compute) -> str | None:
        """compute(tensor), remembered under `key` while the tensor lives at its current version."""
        known = self._digests.get(key)
        version = tensor._version
        if known is not None and known[1] == version and known[0]() is tensor:
            return known[2]
        value = compute(tensor)
        if value is not None:
            self._digests[key] = (_weak(tensor), version, value)
        return value

    def op_digest(self, tensor: torch.Tensor) -> str:
        """The digest of an op's argument in the log: `digest` for a contiguous tensor; for a
        transposed or permuted one (weight.t() into addmm), its memory in storage order framed
        with its strides, instead of a row-major copy (the copy cost more than the hashing).
        Both runs of a comparison log alike, so equal digests still mean equal arguments."""
        if tensor.is_contiguous() or not tensor.is_cpu or tensor.layout is not torch.strided:
            return self.digest(tensor)
        # A slot of its own (~id): the same tensor's `digest` value differs.
        value = self._cached(~id(tensor), tensor, _permuted_digest)
        return value if value is not None else self.digest(tensor)

    def write(self, log: OpLog) -> None:
        """Append this step's records to `log` (and save any op values asked for beside it)."""
        records, values, self.records, self.values = self.records, self.values, [], {}
        self._digests.clear()
        log.append(self.step, records)
        if values:
            from safetensors.torch import save_file

            save_file(
                values,
                str(log.path.parent / RunFolder.dumped_output_name(self.step, self.dump_index)),
            )


class OpLog:
    """The op log of one process: `ops/ops.jsonl` (`ops/ops.<stream>.jsonl` for other streams).

    Each recorded step is a header line {"step": N, "ops": K} followed by its K op records. One file
    per process, opened once and appended to: creating a file per step cost ~0.2 ms a step here,
    and ranks recording the same step no longer share a file. A step whose block was cut short (a
    killed process) reads as not recorded."""

    def __init__(self, run_dir: Path, stream: str | None = None):
        self.path = RunFolder(run_dir).op_log(stream)
        self._handle = None

    def append(self, step: int, records: list[dict]) -> None:
        """Append one recorded step: a header line, then its op records."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")
        encode = _encode_record
        self._handle.write(f'{{"step":{int(step)},"ops":{len(records)}}}\n')
        self._handle.writelines(encode(record) + "\n" for record in records)
        self._handle.flush()  # in the OS from here on: survives the process being killed

    def close(self) -> None:
        """Close the log file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _weak(tensor: torch.Tensor):
    try:
        return weakref.ref(tensor)
    except TypeError:  # a tensor-like that takes no weak references: hold it for the step
        return lambda: tensor


def _permuted_digest(tensor: torch.Tensor) -> str | None:
    """Digest of a dense tensor whose dimensions are stored in another order, or None for any
    other layout."""
    import ctypes

    import xxhash

    shape, strides = tensor.shape, tensor.stride()
    expected = 1
    for dim in sorted(range(len(shape)), key=lambda d: strides[d]):
        if shape[dim] != 1 and strides[dim] != expected:
            return None  # gaps or overlaps: not a permutation of a dense block
        expected *= shape[dim]
    nbytes = tensor.numel() * tensor.element_size()
    hasher = xxhash.xxh3_128(f"permuted|{tensor.dtype}|{tuple(shape)}|{strides}|{nbytes}".encode())
    if nbytes:
        hasher.update((ctypes.c_char * nbytes).from_address(tensor.data_ptr()))
    return hasher.hexdigest()


_NAMES: dict[int, tuple[Any, str]] = {}  # id -> (weak reference, path)
# One encoder for every record (json.dumps with options builds one per call); the key order is the
# order on_op builds each record in, the same in every run, so it needs no sorting.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_DTYPE_NAMES: dict[Any, str] = {}
_RECORD_KEYS = {"i", "op", "phase", "in", "out", "shapes", "dtypes", "module", "line", "node", "sc"}


def _json_text(value: str | None) -> str:
    if value is None:
        return "null"
    if '"' in value or "\\" in value or not value.isprintable():
        return json.dumps(value, ensure_ascii=False)
    return '"' + value + '"'


def _json_texts(values: list[str]) -> str:
    """A list of digests or dtype names (characters that never need escaping) as JSON."""
    return '["' + '","'.join(values) + '"]' if values else "[]"


def _encode_record(record: dict) -> str:
    """One op record as a JSON line, written out by hand: about half the time of json's encoder,
    which a recorded step pays once per op. Any other shape of record goes through json."""
    if record.keys() - _RECORD_KEYS or not _RECORD_KEYS - {"node", "sc"} <= record.keys():
        return _ENCODER.encode(record)
    node, scalars = record.get("node"), record.get("sc")
    return (
        f'{{"i":{record["i"]},"op":{_json_text(record["op"])},"phase":{_json_text(record["phase"])},'
        f'"in":{_json_texts(record["in"])},"out":{_json_texts(record["out"])},'
        f'"shapes":{repr(record["shapes"]).replace(" ", "")},'
        f'"dtypes":{_json_texts(record["dtypes"])},'
        f'"module":{_json_text(record["module"])},"line":{_json_text(record["line"])}'
        + ("" if scalars is None else f',"sc":{_json_texts(scalars)}')
        + ("" if node is None else f',"node":{_json_text(node)}')
        + "}"
    )


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_SKIPPED = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default}
_SKIP: dict[
    Any, bool
] = {}  # op -> not recorded (views, detach, profiler markers), decided once per op
