"""Drive PyTorch's own OpInfo sample inputs through portable mode and print, per op, a digest of
every output and input gradient (or why it did not run), for tests/e2e/test_portable_coverage.py.

usage: portable_opinfo.py SAMPLES_FILE (save|load) OPS PER_OP  (PER_OP 0: every sample)

OPS is a JSON list of "name.variant" or {"sample": N, "seed": S} for a seeded draw of N of the
OpInfos that support float32 on the CPU ("all" for N: every one). Prints {"names", "results"}.
(The test process never imports op_db itself: importing it turns off torch.backends' global
flags for the whole process.)

`save` draws the sample inputs (seeded) and writes them to SAMPLES_FILE, `load` reads them, so
that every setting computes on the same bits. In `save` mode each result is also compared with
torch's float64 result on the same inputs (the largest error relative to the tolerance), and so is
torch's own float32 result without the mode (where a backward formula loses digits in float32,
torch's own result misses the tolerance as much).
"""

import contextlib
import io
import json
import math
import random
import sys

import torch
import xxhash
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._python_dispatch import TorchDispatchMode

from twice.portable.dispatch.mode import PortableError, PortableMode

path, action, wanted, per_op = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
RTOL, ATOL = 1e-4, 1e-5
# Their results are uninitialised memory, the same or not by chance: no result to compare.
UNINITIALISED = {"empty", "new_empty", "empty_like", "empty_permuted", "empty_strided"}
UNINITIALISED |= {"new_empty_strided"}
ops = {f"{o.name}.{o.variant_test_name}": o for o in op_db}
if isinstance(wanted, dict):
    pool = sorted(
        name
        for name, o in ops.items()
        if torch.float32 in o.supported_dtypes("cpu") and not name.startswith("jiterator")
    )
    count = wanted["sample"]
    wanted = pool if count == "all" else sorted(random.Random(wanted["seed"]).sample(pool, count))


def tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


def digest(values) -> str:
    h = xxhash.xxh3_128()
    for t in values:
        t = t.detach()
        if t.layout != torch.strided:  # a sparse result: its values in place, and its layout
            h.update(str(t.layout).encode())
            t = t.to_dense()
        if t.is_floating_point():
            t = t.masked_fill(t.isnan(), math.nan)  # NaN payloads are not compared
        if t.is_complex():
            t = torch.view_as_real(t.resolve_conj())
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.contiguous().numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def leaves(sample):
    return [
        t
        for t in tensors([sample.input, sample.args, sample.kwargs])
        if t.requires_grad and t.is_leaf
    ]


def run(op, sample, mode, process=None):
    """(outputs, input gradients, outputs as the OpInfo's own `output_process_fn_grad` shows
    them): the gradients are of the shown outputs' sum, so an output defined up to a sign
    (eigenvectors, singular vectors) is compared, and differentiated, as the OpInfo does."""
    with mode:
        out = op(sample.input, *sample.args, **sample.kwargs)
        outs = tensors(out)
        shown = tensors(process(out)) if process is not None else outs
        grads = []
        differentiable = [o for o in shown if o.requires_grad and o.is_floating_point()]
        inputs = leaves(sample)
        if op.supports_autograd and differentiable and inputs:
            loss = sum(o.sum() for o in differentiable)
            grads = [
                g for g in torch.autograd.grad(loss, inputs, allow_unused=True) if g is not None
            ]
    return outs, grads, shown


def processes(op, count):
    """The OpInfo's own output processing of its first `count` samples (their functions are
    not saved with the inputs: the generator makes the same sample kinds in the same order)."""
    try:
        made = list(op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd))
    except Exception:
        return [None] * count
    found = [s.output_process_fn_grad for s in made[:count]]
    return found + [None] * (count - len(found))


def error_ratio(ours, reference) -> float:
    """The largest |ours - reference| / (ATOL + RTOL |reference|) over the float outputs (0 where
    the shapes or kinds do not line up, or both are the same non-finite value)."""
    worst = 0.0
    for a, b in zip(ours, reference):
        if not (a.is_floating_point() and b.is_floating_point()) or a.shape != b.shape:
            continue
        a, b = (t.detach().to_dense() if t.layout != torch.strided else t.detach() for t in (a, b))
        a, b = a.double(), b.double()
        same = (a == b) | (a.isnan() & b.isnan())
        err = ((a - b).abs() / (ATOL + RTOL * b.abs())).masked_fill(same, 0.0)
        if err.numel():
            worst = max(worst, float(err.nan_to_num(math.inf).max()))
    return worst


class Seeded(TorchDispatchMode):
    """Notes whether a random operation ran (torch's own streams differ from Philox's)."""

    random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        return func(*args, **(kwargs or {}))


def to64(sample):
    def conv(t):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            return t.detach().double().requires_grad_(t.requires_grad)
        return t

    return sample.transform(conv)


def copied(sample):
    """The sample on copies of its tensors: torch's own run of an op that updates an input in
    place (batch norm's running statistics, shared by later samples) happens in `save` only, so
    it must not change what the later samples compute on."""

    def conv(t):
        if isinstance(t, torch.Tensor):
            return t.detach().clone().requires_grad_(t.requires_grad)
        return t

    return sample.transform(conv)


if action == "save":
    torch.manual_seed(0)
    drawn = {}
    for name in wanted:
        op = ops[name]
        try:
            samples = list(
                op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)
            )
        except Exception as exc:  # the OpInfo cannot make samples here
            drawn[name] = repr(exc)[:200]
            continue
        drawn[name] = [(s.input, s.args, s.kwargs) for s in samples[: per_op or None]]
    for name, value in list(drawn.items()):
        try:
            torch.save(value, io.BytesIO())
        except Exception as exc:  # a sample holding a function: not carried between settings
            drawn[name] = f"samples not picklable: {exc!r}"[:200]
    torch.save(drawn, path)
drawn = torch.load(path, weights_only=False)

results = {}
for name in wanted:
    op, samples = ops[name], drawn[name]
    if isinstance(samples, str) or op.name in UNINITIALISED:
        results[name] = {"skipped": samples if isinstance(samples, str) else "uninitialised"}
        continue
    samples = [SampleInput(i, args=a, kwargs=k) for i, a, k in samples]
    shows = processes(op, len(samples))
    found = {"digests": [], "error": None}
    for index, sample in enumerate(samples):
        show = shows[index]
        try:
            torch.manual_seed(index)
            outs, grads, shown = run(op, sample, PortableMode("strict"), show)
            if index == 0:  # uninitialised memory (empty_like) is no result to compare
                torch.manual_seed(index)
                again = run(op, sample, PortableMode("strict"), show)
                if digest(again[0] + again[1]) != digest(outs + grads):
                    found["unstable"] = True
                    break
        except PortableError as exc:
            found["uncovered"] = str(exc).split(" is not covered")[0]
            break
        except Exception as exc:  # an op or sample torch itself may refuse
            try:
                run(op, sample, contextlib.nullcontext())
            except Exception:
                continue  # refused without the mode too: no portable question
            found["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            break
        found["digests"].append(digest(outs + grads))
        if action == "save":
            seen = Seeded()
            try:
                torch.manual_seed(0)
                ref_outs, ref_grads, ref_shown = run(op, to64(sample), seen, show)
                torch.manual_seed(0)
                other = run(op, to64(sample), contextlib.nullcontext(), show)
            except Exception:
                continue
            if seen.random or digest(other[0] + other[1]) != digest(ref_outs + ref_grads):
                continue  # random or uninitialised values: not a function of the inputs
            if name.startswith("as_strided"):
                continue  # reads storage, which the float64 copy lays out anew
            # the gradients line up only where both runs have the same inputs' (a loaded sparse
            # input may come back a leaf in one and not the other)
            aligned = len(grads) == len(ref_grads)
            ratio = (
                error_ratio(shown + grads, ref_shown + ref_grads)
                if aligned
                else error_ratio(shown, ref_shown)
            )
            found["error_ratio"] = max(found.get("error_ratio", 0.0), ratio)
            try:
                torch.manual_seed(index)
                _, plain_grads, plain_shown = run(
                    op, copied(sample), contextlib.nullcontext(), show
                )
            except Exception:
                continue
            plain = error_ratio(plain_shown + plain_grads, ref_shown + ref_grads)
            found["torch_error_ratio"] = max(found.get("torch_error_ratio", 0.0), plain)
    results[name] = found
print(json.dumps({"names": wanted, "results": results}))
