"""Verdicts by construction: generated traces, edited or damaged in one run or in both, are
"bit-identical" (exit 0) only when both are whole, valid and equal step for step; damage is an
error (exit 2), never a verdict. The strategies are built from the record schema
(core/records.py), so a field added there is generated here."""

import json
import os
import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twice.app.compare import compare_runs
from twice.core import digests
from twice.core.errors import TwiceError
from twice.core.records import FIELD_OF, StepRecord, record_line
from twice.store import tracescan
from twice.store.files import write_json_atomic
from twice.store.traces import read_trace

# `make test` draws a bounded sample with a fixed seed; `make test-slow` (TWICE_EXHAUSTIVE=1)
# draws twenty times as many, at random.
EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
CHECKS = settings(
    max_examples=1200 if EXHAUSTIVE else 30,
    derandomize=not EXHAUSTIVE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

digest = st.binary(min_size=16, max_size=16).map(bytes.hex)
hex_float = st.floats(allow_nan=False, allow_infinity=True, width=64).map(
    lambda x: float.hex(x) if x == x and abs(x) != float("inf") else str(x)
) | st.integers(0, 2**64 - 1).map(lambda bits: f"nan:{bits:016x}")
names = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=12
)

# One strategy per field, from the schema: every field of StepRecord must have one.
FIELD_VALUES = {
    "loss": hex_float | st.lists(hex_float, min_size=1, max_size=3),
    "batch": digest,
    "grads": digest,
    "grad_norm": hex_float,
    "lr": st.lists(hex_float, min_size=1, max_size=2),
    "params": digest,
    "rng": st.dictionaries(st.sampled_from(["torch", "numpy", "python", "cuda:0"]), digest),
    "param_digests": st.dictionaries(names, digest, max_size=3),
    "grad_digests": st.dictionaries(names, digest, max_size=3),
    "params_before": digest,
    "params_full": digest,
    "skipped": st.booleans(),
    "time": st.floats(min_value=0, max_value=1e6),
}
assert set(FIELD_VALUES) | {"step"} == set(StepRecord.__dataclass_fields__)

# Values of the wrong type or range for every field (each wrong for some field).
WRONG = [
    1,
    -1,
    1.5,
    1e308,
    True,
    "",
    "zz",
    "ab",
    "A" * 32,
    "g" * 32,
    "0x1.8p+0 ",
    "nan",
    [],
    [1],
    {},
    {"x": 1},
    {"x": ""},
    "\u0000",
]


@st.composite
def traces(draw, every=1):
    """A valid trace: records of steps 0, every, 2*every, ..., the first holding params_before."""
    count = draw(st.integers(1, 6))
    records = []
    for index in range(count):
        fields = {}
        for name, strategy in FIELD_VALUES.items():
            if name == "params_before" and index:
                continue
            if name == "params" or draw(st.booleans()):
                fields[name] = draw(strategy)
        records.append(StepRecord(step=index * every, **fields))
    return records


def _lines(records):
    return [record_line(r) for r in records]


def _mutate(draw, lines):
    """One edit of a trace's lines: a field's value, type or presence, a step's number, a line
    removed, repeated or damaged as bytes."""
    lines = list(lines)
    index = draw(st.integers(0, len(lines) - 1))
    data = json.loads(lines[index])
    kind = draw(
        st.sampled_from(
            ["wrong", "remove", "value", "renumber", "drop", "repeat", "bytes", "add", "time"]
        )
    )
    if kind == "wrong":
        data[draw(st.sampled_from(sorted(FIELD_VALUES) + ["step"]))] = draw(st.sampled_from(WRONG))
    elif kind == "remove":
        data.pop(draw(st.sampled_from(sorted(data))))
    elif kind == "value":
        name = draw(st.sampled_from(sorted(FIELD_VALUES)))
        data[name] = (
            json.loads(record_line(StepRecord(0, **{name: draw(FIELD_VALUES[name])}))).get(name)
            if name not in ("time",)
            else 1.0
        )
    elif kind == "renumber":
        data["step"] = draw(st.integers(0, 12))
    elif kind == "add":
        data[draw(names)] = draw(st.sampled_from(WRONG))
    elif kind == "time":
        data["time"] = draw(st.floats(min_value=0, max_value=10))
    if kind == "drop":
        del lines[index]
    elif kind == "repeat":
        lines.insert(index, lines[index])
    elif kind == "bytes":
        line = bytearray(lines[index])
        at = draw(st.integers(0, len(line) - 2))
        how = draw(st.sampled_from(["nul", "flip", "cut", "prefix"]))
        if how == "nul":
            line[at] = 0
        elif how == "flip":
            line[at] ^= 1 << draw(st.integers(0, 6))
        elif how == "cut":
            line = line[:at] + b'"step":%d}\n' % data["step"]
        else:
            line = b"x" + line
        lines[index] = bytes(line)
    else:
        lines[index] = (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()
    return lines


def _run(folder, lines, every=1, steps=None):
    folder.mkdir()
    manifest = {
        "identity": {"argv": ["python", "train.py"], "seed": 0},
        "context": {"status": "completed", "trace_every": every, "steps": steps},
    }
    write_json_atomic(folder / "manifest.json", manifest)
    (folder / "trace.jsonl").write_bytes(b"".join(lines))
    return folder


def _oracle(path_a, path_b):
    """What the verdict must be, from the full reader: None (damage: an error), "unjudged" (a run
    recorded no step), True (whole, valid and equal in every compared field at the same steps)
    or False."""
    try:
        a, b = read_trace(path_a), read_trace(path_b)
    except TwiceError:
        return None
    if not a or not b:
        return "unjudged"

    def held(record, name):
        value = getattr(record, name)
        return None if value in ({}, []) else value

    if [r.step for r in a] != [r.step for r in b]:
        return False
    for ra, rb in zip(a, b, strict=True):
        if any(held(ra, n) != held(rb, n) for n in FIELD_OF):
            return False
    return True


def _verdict(tmp_path, lines_a, lines_b):
    a, b = _run(tmp_path / "a", lines_a), _run(tmp_path / "b", lines_b)
    expected = _oracle(a / "trace.jsonl", b / "trace.jsonl")
    try:
        result = compare_runs(a, b)
    except TwiceError:
        assert expected is None, "an error for two whole, valid traces"
        return
    assert expected is not None, f"a verdict ({result.verdict}) on a damaged trace"
    if expected == "unjudged":
        assert result.exit_code == 2 and result.verdict.startswith("cannot judge")
        return
    assert (result.exit_code == 0) == expected, result.verdict
    assert result.exit_code in (0, 1)


@pytest.fixture(params=["native", "python"])
def walk(request, monkeypatch):
    """Run each check through the compiled fast path and through its Python twin."""
    if request.param == "python":
        monkeypatch.setattr(digests, "native", None)
    elif digests.native is None:
        pytest.skip("twice._native is not built here")


@CHECKS
@given(data=st.data())
def test_an_edit_to_one_trace_is_never_bit_identical(tmp_path_factory, walk, data):
    lines = _lines(data.draw(traces()))
    edited = _mutate(data.draw, lines)
    order = data.draw(st.booleans())
    _verdict(tmp_path_factory.mktemp("one"), *((lines, edited) if order else (edited, lines)))


@CHECKS
@given(data=st.data())
def test_the_same_damage_in_both_traces_is_never_bit_identical(tmp_path_factory, walk, data):
    edited = _mutate(data.draw, _lines(data.draw(traces())))
    # the other run's times differ, so the comparison takes its fast path line by line
    other = [
        line.replace(b'"time":', b'"time":1', 1) if b'"time":0.' not in line else line
        for line in edited
    ]
    _verdict(tmp_path_factory.mktemp("both"), edited, other)
    _verdict(tmp_path_factory.mktemp("self"), edited, edited)


@CHECKS
@given(data=st.data())
def test_the_native_validator_accepts_only_valid_canonical_records(data):
    if digests.native is None:
        pytest.skip("twice._native is not built here")
    lines = _mutate(data.draw, _lines(data.draw(traces())))
    for line in lines:
        native = digests.native.record_valid(line)
        found = tracescan.line_step(line)
        python = found is not None and tracescan.record_valid(line, found[0])
        assert native == python, line
        if native:  # accepted: a valid record whose canonical line this is
            record = StepRecord.from_json(json.loads(line))
            canonical = record_line(record)
            assert canonical[: tracescan.line_step(canonical)[0]] == line[: found[0]]


@CHECKS
@given(data=st.data())
def test_runs_recorded_at_other_intervals_differ_only_where_both_recorded(tmp_path_factory, data):
    """--trace-every is a recording setting: runs recorded at other intervals are compared at the
    steps both recorded, and differ only there, where one ran more steps, or where a run lacks a
    step it was due to record."""
    every_a, every_b = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    records = data.draw(traces(every=every_a))
    if every_a == every_b:
        others = records[: data.draw(st.integers(1, len(records)))]
    else:
        others = data.draw(traces(every=every_b))
        if data.draw(st.booleans()):  # the same training, recorded at another interval
            by_step = {r.step: r for r in records}
            others = [by_step.get(r.step, r) for r in others]
    folder = tmp_path_factory.mktemp("interval")
    a = _run(folder / "a", _lines(records), every_a, steps=len(records) * every_a)
    b = _run(folder / "b", _lines(others), every_b, steps=len(others) * every_b)
    result = compare_runs(a, b)

    def held(record, name):
        value = getattr(record, name)
        return None if value in ({}, []) else value

    steps_a, steps_b = {r.step: r for r in records}, {r.step: r for r in others}
    equal = all(
        held(steps_a[s], n) == held(steps_b[s], n)
        for s in set(steps_a) & set(steps_b)
        for n in FIELD_OF
    )
    due = any(s % every_b == 0 for s in set(steps_a) - set(steps_b)) or any(
        s % every_a == 0 for s in set(steps_b) - set(steps_a)
    )
    same = equal and not due and len(records) * every_a == len(others) * every_b
    assert result.exit_code == (0 if same else 1), result.verdict
    if every_a != every_b:
        assert f"--trace-every {every_a} vs {every_b}" in result.verdict


def test_the_issue_example_six_steps_every_two_against_nine_every_three(tmp_path):
    def trace(steps, every, lr):
        return _lines(
            [
                StepRecord(step=s, params=f"{s:032x}", lr=[(0.1 if s == 0 else lr).hex()])
                for s in range(0, steps, every)
            ]
        )

    a = _run(tmp_path / "a", trace(6, 2, 0.1), 2, steps=6)
    b = _run(tmp_path / "b", trace(9, 3, 0.2), 3, steps=9)
    result = compare_runs(a, b)
    assert result.exit_code == 1
    assert "--trace-every 2 vs 3" in result.verdict and "A ran 6 steps and B 9" in result.verdict


def test_a_crafted_resume_record_cannot_hide_steps_the_trace_holds(tmp_path):
    records = [StepRecord(step=s, params=f"{s:032x}") for s in range(6)]
    changed = [StepRecord(step=s, params=f"{s + (s >= 1):032x}") for s in range(6)]
    a = _run(tmp_path / "a", _lines(records))
    b = _run(tmp_path / "b", _lines(changed))
    write_json_atomic(b / "resumed.json", {"checkpoint": "step-5", "step": 5})
    with pytest.raises(TwiceError, match="before step 5, where the run's resume record"):
        compare_runs(a, b)


def test_per_tensor_digests_that_differ_in_one_trace_only_are_a_difference(tmp_path):
    records = [StepRecord(step=s, params="0" * 32, param_digests={"w": "1" * 32}) for s in (0, 1)]
    edited = [records[0], StepRecord(step=1, params="0" * 32, param_digests={"w": "2" * 32})]
    result = compare_runs(
        _run(tmp_path / "a", _lines(records)), _run(tmp_path / "b", _lines(edited))
    )
    assert result.exit_code == 1 and result.divergence.step == 1
    assert result.divergence.tensors == {"params": ["w"]}


@pytest.mark.parametrize("kind", ["fifo", "devzero", "symlink"])
def test_a_trace_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    lines = _lines([StepRecord(step=0, params="0" * 32)])
    a = _run(tmp_path / "a", lines)
    b = _run(tmp_path / "b", lines)
    trace = b / "trace.jsonl"
    trace.unlink()
    if kind == "fifo":
        os.mkfifo(trace)
    elif kind == "devzero":
        trace.symlink_to("/dev/zero")
    else:
        trace.symlink_to(a / "trace.jsonl")
    with pytest.raises(TwiceError, match="regular file|not a link"):
        compare_runs(a, b)


# -- manifests: every field twice reads has its type, checked where the file is read -------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real run of a small script, whose manifest the checks below damage copies of."""
    from conftest import runs, script, twice

    folder = tmp_path_factory.mktemp("recorded")
    script("tiny_train.py", folder)
    result = twice("run", "--", sys.executable, "tiny_train.py", "out", cwd=folder)
    assert result.returncode == 0, result.stderr
    return runs(folder)[0]


def _paths(value, prefix=()):
    """Every key path of a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from _paths(item, prefix + (key,))


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _type_of(value):
    return "number" if type(value) in (int, float) else type(value).__name__


# The fields twice reads by type: a value of another type there is damage (exit 2).
TYPED = [
    ("identity", "argv"),
    ("identity", "seed"),
    ("identity", "torch"),
    ("identity", "threads"),
    ("identity", "packages"),
    ("identity", "env"),
    ("identity", "code"),
    ("identity", "determinism"),
    ("identity", "determinism", "mode"),
    ("identity", "threads", "intra_op_threads"),
    ("identity", "packages", "torch"),
    ("context", "status"),
    ("context", "started"),
    ("context", "ended"),
    ("context", "steps"),
    ("context", "trace_every"),
    ("context", "events"),
    ("context", "outputs"),
    ("context", "launcher"),
    ("context", "executable"),
]


@settings(CHECKS, max_examples=400 if EXHAUSTIVE else 20)
@given(data=st.data())
def test_a_manifest_field_of_another_type_is_an_error_never_a_traceback(
    tmp_path_factory, recorded, data
):
    from click.testing import CliRunner

    from twice.cli import main

    manifest = json.loads((recorded / "manifest.json").read_text())
    paths = sorted(_paths(manifest))
    path = data.draw(st.sampled_from(TYPED) | st.sampled_from(paths))
    original = manifest
    for key in path:
        original = original.get(key) if isinstance(original, dict) else None
    value = data.draw(
        st.sampled_from([w for w in WRONG + [None, 1e308, -5] if _type_of(w) != _type_of(original)])
    )
    _set(manifest, path, value)
    folder = tmp_path_factory.mktemp("manifest") / "run"
    shutil.copytree(recorded, folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    runner = CliRunner()
    for args in (
        ["show", str(folder)],
        ["ls", str(folder.parent)],
        ["diff", str(folder), str(recorded)],
    ):
        result = runner.invoke(main, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            args,
            path,
            value,
            result.exception,
        )
        assert "Traceback" not in result.output
        if path in TYPED and value is not None and args[0] != "ls":
            assert result.exit_code == 2 and "error:" in result.output, (args, path, value)
        if args[0] == "diff" and value is not None:
            assert result.exit_code != 0 or path not in TYPED, (path, value)


# -- checkpoints: "valid" only where load() returns well-formed tensors equal to the saved ones ---


def _reseal(folder):
    """Recompute every digest and size in a checkpoint's index, as whoever crafts one would."""
    import xxhash

    from twice.checkpoint.index import index_bytes

    index = json.loads(folder.joinpath("checkpoint.json").read_text())
    index.pop("self", None)
    for name in list(index["files"]):
        data = folder.joinpath(name).read_bytes()
        index["files"][name] = {"size": len(data), "digest": xxhash.xxh3_128_hexdigest(data)}
    folder.joinpath("checkpoint.json").write_bytes(index_bytes(index))


def _saved(folder):
    import torch

    from twice import checkpoint

    gen = torch.Generator().manual_seed(0)
    coo = torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.rand(3, generator=gen), (3, 3)
    ).coalesce()
    dense = torch.rand(4, 3, generator=gen)
    csr = dense.masked_fill(dense < 0.5, 0).to_sparse_csr()
    state = {"coo": coo, "csr": csr, "dense": dense}
    checkpoint.save(folder, state=state)
    return state


def _same(a, b):
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a.layout != b.layout or a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.to_dense(), b.to_dense())


@settings(CHECKS, max_examples=300 if EXHAUSTIVE else 20)
@given(data=st.data())
def test_a_resealed_checkpoint_is_valid_only_if_it_loads_what_was_saved(tmp_path_factory, data):
    """Edit one value of state.json or one byte of the tensor file, recompute every digest as a
    crafter would, then: verify refuses it, or load returns well-formed tensors (each survives
    to_dense) and "valid" never stands for tensors other than the saved ones unless the edit
    changed them (then load returns what the edit says, still well-formed)."""
    from twice import checkpoint

    folder = tmp_path_factory.mktemp("ckpt") / "step-1"
    saved = _saved(folder)
    how = data.draw(st.sampled_from(["state", "tensors", "pickle"]))
    if how == "state":
        state = json.loads(folder.joinpath("state.json").read_text())
        paths = [p for p in _paths(state) if p]
        path = data.draw(st.sampled_from(paths))
        _set(state, path, data.draw(st.sampled_from(WRONG + [None, 0, 2, 3, 99, [3, 3], [0, 9]])))
        folder.joinpath("state.json").write_text(json.dumps(state))
    elif how == "tensors":
        raw = bytearray(folder.joinpath("tensors.safetensors").read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
        folder.joinpath("tensors.safetensors").write_bytes(bytes(raw))
    else:
        import pickle

        folder.joinpath("tensors.safetensors").write_bytes(pickle.dumps(saved["dense"].numpy()))
    _reseal(folder)
    try:
        checkpoint.verify(folder)
    except TwiceError:
        return
    loaded = checkpoint.load(folder, strict=False)["state"]
    for value in loaded.values() if isinstance(loaded, dict) else [loaded]:
        if hasattr(value, "to_dense"):
            value.to_dense()  # well-formed: no out-of-bounds index reaches memory


def test_a_sparse_tensor_with_indices_outside_its_shape_is_not_valid(tmp_path):
    import torch

    from twice import checkpoint

    folder = tmp_path / "step-1"
    checkpoint.save(
        folder, state={"coo": torch.sparse_coo_tensor(torch.tensor([[0], [1]]), [1.0], (2, 2))}
    )
    state = json.loads(folder.joinpath("state.json").read_text())
    text = json.dumps(state).replace("[2, 2]", "[1, 1]")
    assert text != json.dumps(state)
    folder.joinpath("state.json").write_text(text)
    _reseal(folder)
    with pytest.raises(TwiceError, match="cannot be read"):
        checkpoint.verify(folder)


# -- processes: each one that steps has a stream of its own, however it was started ---------------


# spawn in `make test`; forkserver, fork (also held by the Hogwild tests) and subprocess are
# marked slow (run in CI and `make test-slow`), to keep the suite's time on two cores
@pytest.mark.parametrize(
    "method",
    [
        "spawn",
        pytest.param("forkserver", marks=pytest.mark.slow),
        pytest.param("fork", marks=pytest.mark.slow),
        pytest.param("subprocess", marks=pytest.mark.slow),
    ],
)
def test_every_process_that_steps_gets_its_own_stream(tmp_path, method):
    from conftest import runs, script, twice

    from twice.store.traces import trace_files

    script("workers_train.py", tmp_path)
    for name in ("a", "b"):
        result = twice(
            "run", "--name", name, "--", sys.executable, "workers_train.py", method, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
    a, b = runs(tmp_path)
    streams = trace_files(a)
    assert len(streams) == 2, sorted(streams)  # the parent's and the worker's
    assert sorted(streams) == sorted(trace_files(b))
    for path in streams.values():
        steps = [r.step for r in read_trace(path)]
        assert steps == list(range(len(steps))) and steps, (path, steps)
    result = twice("diff", a, b, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical" in result.stdout
