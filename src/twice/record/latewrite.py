"""The step trace on an accelerator, read a step late: no synchronisation in the training step.

Reading a step's digests, norms and loss back to the host as the step ends makes the host wait
for the device to drain, every step. Here, for plain dense tensors on a CUDA device (where
Triton is there), a step's gradients and parameters are folded by one multi-tensor Triton kernel
per batch of tensors (`twice._fold_kernel.fold_many`), their norms and the loss stay on the
device, and all of it is copied to pinned host memory with `non_blocking` copies behind a CUDA
event. The record is written when the next recorded step ends (by then the copies are long
done), and at the latest when the process ends, stops, resumes, forks or receives SIGTERM: a
process killed with SIGKILL loses its last step's line, never a line half written.

The digests are `digest()`'s, bit for bit (`core.digests.device_digest` of the same fold); the
record is the one the synchronous path writes, one step later. `LateWriter(devices=("cuda",
"cpu"))` takes CPU tensors too, for tests under Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import threading
from typing import Any

from twice.core.digests import device_digest
from twice.record.openstep import StepRound

__all__ = ["LateDigest", "LateWriter"]


class LateDigest:
    """A tensor's digest whose fold is still on the device: `value` once resolved."""

    __slots__ = ("dtype", "shape", "nbytes", "sums", "row", "value")

    def __init__(self, dtype, shape, nbytes: int, sums: list, row: int):
        """Row `row` of the fold sums in `sums[0]` (the batch's device tensor, then its host
        copy) is this tensor's."""
        self.dtype, self.shape, self.nbytes, self.sums, self.row = dtype, shape, nbytes, sums, row
        self.value: str | None = None


class _Batch:
    """The fold sums of one call's tensors: on the device, then in pinned host memory."""

    __slots__ = ("sums", "keep")

    def __init__(self, sums, keep: list):
        self.sums, self.keep = [sums], keep


class LateWriter:
    """Digests and norms left on the device, and the copies that bring a step's back."""

    def __init__(self, devices: tuple[str, ...] = ("cuda",)):
        """Take tensors on devices of these types (`cuda`; tests add `cpu`)."""
        self.devices = devices
        self._fold = None  # twice._fold_kernel.fold_many, once known to load
        self._batches: list[_Batch] = []  # of the step being gathered
        self._watching = False  # the SIGTERM handler is installed (once per writer)
        self.on_kill: list = []  # called on SIGTERM before it goes on: the recorder's flush

    def digests(self, tensors: list, norms: bool, lanes_norm, tensor_norms):
        """(LateDigests, norms) of `tensors`, or None where this path does not take them (then
        the caller digests them now). The norms are those the synchronous path takes
        (`lanes_norm` on the CPU, else `tensor_norms`: 0-d tensors on the device), read later."""
        if not tensors or not self._takes(tensors):
            return None
        fold = self._fold_many()
        if fold is None:
            return None
        import torch

        raws = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        keep: list = []
        batch = _Batch(fold(raws, keep), keep)
        self._batches.append(batch)
        digests = [
            LateDigest(t.dtype, tuple(t.shape), raw.numel(), batch.sums, row)
            for row, (t, raw) in enumerate(zip(tensors, raws))
        ]
        if not norms:
            return digests, []
        found = [lanes_norm(t) for t in tensors]
        missing = [i for i, norm in enumerate(found) if norm is None]
        for i, norm in zip(missing, tensor_norms([tensors[i] for i in missing])):
            found[i] = norm
        return digests, found

    def _takes(self, tensors: list) -> bool:
        import torch

        device = tensors[0].device
        if device.type not in self.devices:
            return False
        for t in tensors:
            if (
                t.device != device
                or t.layout is not torch.strided
                or type(t) is not torch.Tensor
                and not isinstance(t, torch.nn.Parameter)
                or t.is_quantized
                or t.is_nested
                or t.is_complex()
            ):
                return False
        return True

    def _fold_many(self):
        if self._fold is None:
            from twice.core.device_fold import _triton_fold

            interpreted = os.environ.get("TRITON_INTERPRET") == "1" and "cpu" in self.devices
            if _triton_fold() is None and not interpreted:
                self._fold = False
            else:
                try:
                    from twice._fold_kernel import fold_many
                except Exception:  # noqa: BLE001 - no Triton here: the synchronous path
                    fold_many = False
                self._fold = fold_many
        return self._fold or None

    def start(self, round_: StepRound) -> bool:
        """Start the copies of what `round_` left on the device (this step's fold sums, norms and
        losses) and return True; False where it holds nothing on the device (write it now)."""
        batches, self._batches = self._batches, []
        if not batches and "cpu" not in self.devices:  # on the CPU: one cheap test a step
            torch = sys.modules.get("torch")
            if torch is None or not torch.cuda.is_initialized():
                return False
        devices = {v.device.type for v in _device_values(round_) if _on_device(v)}
        devices |= {batch.sums[0].device.type for batch in batches}
        if not devices:
            return False
        for batch in batches:
            batch.sums[0] = _to_host(batch.sums[0])
        put = _host_scalars(round_)
        round_.late = (batches, put, _cuda_event() if "cuda" in devices else None)
        self._watch_kill()
        return True

    def resolve(self, round_: StepRound) -> None:
        """Wait for `round_`'s copies (done long since) and put their values in the round: the
        digests as text, the norms and losses as floats."""
        batches, scalars, event = round_.late
        if event is not None:
            event.synchronize()
        words = {}
        for batch in batches:
            words[id(batch.sums)] = batch.sums[0].numpy()
        for pairs in (round_.grads, round_.params):
            for i, (name, value) in enumerate(pairs):
                if isinstance(value, LateDigest):
                    row = words[id(value.sums)][value.row]
                    fold = struct.pack("<q", value.nbytes) + row.astype("<i8").tobytes()
                    pairs[i] = (name, device_digest(value.dtype, value.shape, fold))
        scalars()
        round_.late = None

    def _watch_kill(self) -> None:
        """On the first late step: SIGTERM writes the step still held, then does what it did."""
        if self._watching or threading.current_thread() is not threading.main_thread():
            return
        self._watching = True
        # (None: a handler set outside Python, which cannot be chained: the default then)
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return

        def on_term(signum, frame):
            for callback in list(self.on_kill):
                callback()
            if callable(previous):
                previous(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)

    def forked(self) -> LateWriter:
        """A fresh writer for a forked child (the parent's steps are the parent's to write)."""
        return LateWriter(self.devices)


def _device_values(round_: StepRound) -> list:
    return [*round_.losses, *round_.grad_squares, *(v for g in round_.param_squares for v in g)]


def _on_device(value: Any) -> bool:
    """A tensor off the CPU (a 0-d norm or loss left where it was computed)."""
    return not isinstance(value, (int, float)) and not value.is_cpu


def _to_host(tensor):
    """A copy of `tensor` in pinned host memory, started without waiting (a plain copy on the
    CPU)."""
    import torch

    if tensor.is_cpu:
        return tensor.clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _host_scalars(round_: StepRound):
    """Start the copy of the round's 0-d device tensors (losses, norms) into one pinned float64
    buffer; the returned function, once the copy is done, puts their floats in their places
    (exactly the floats `float()` of each would give)."""
    import torch

    lists = [round_.losses, round_.grad_squares, *round_.param_squares]
    places = [
        (values, i)
        for values in lists
        for i, v in enumerate(values)
        if isinstance(v, torch.Tensor) and not v.is_cpu
    ]
    if not places:
        return lambda: None
    stacked = torch.stack([values[i].detach().reshape(()).double() for values, i in places])
    host = _to_host(stacked)

    def put() -> None:
        for (values, i), value in zip(places, host.tolist()):
            values[i] = value

    return put


def _cuda_event():
    """A CUDA event behind the copies just queued on the current stream."""
    import torch

    event = torch.cuda.Event()
    event.record()
    return event
