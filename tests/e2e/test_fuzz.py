"""Property-based fuzzing of every reader: arbitrary bytes and arbitrary JSON values in every file
twice reads give a correct answer or a TwiceError, never another exception, and never
"identical" or "valid" for a damaged input."""

import json
import shutil
import sys

import pytest
import torch
import xxhash
from conftest import runs, script, twice
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twice import checkpoint
from twice.app.compare import compare_runs
from twice.app.sweep import SWEEP_FILE, sweep_results
from twice.checkpoint.index import index_bytes
from twice.core.errors import TwiceError
from twice.core.records import COMPARED_FIELDS
from twice.store.faults import read_numerics
from twice.store.metrics import read_metric
from twice.store.oplogs import read_oplog
from twice.store.resumes import read_resume
from twice.store.runs import read_manifest, summarize_run
from twice.store.traces import read_trace

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _dumps(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real recorded run (two steps recorded with ops, a checkpoint) to damage copies of."""
    folder = tmp_path_factory.mktemp("recorded")
    script("every_checkpoint.py", folder)
    result = twice(
        "run", "--record-ops", "1", "--", sys.executable, "every_checkpoint.py", cwd=folder
    )
    assert result.returncode == 0, result.stderr
    (run,) = runs(folder)
    return run


def _copy(run, tmp_path, name):
    target = tmp_path / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(run, target)
    return target


def _compared(path):
    """What diff compares of a trace: each step and its compared fields."""
    return [(r.step, *(getattr(r, f) for f in COMPARED_FIELDS)) for r in read_trace(path)]


def _survives(call):
    """The call answers or raises a TwiceError; anything else fails the test."""
    try:
        return call()
    except TwiceError:
        return None


# -- traces -----------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=400))
def test_trace_of_arbitrary_bytes(recorded, tmp_path, data):
    damaged = _copy(recorded, tmp_path, "b")
    damaged.joinpath("trace.jsonl").write_bytes(data)
    _survives(lambda: read_trace(damaged / "trace.jsonl"))
    result = _survives(lambda: compare_runs(recorded, damaged))
    if result is not None and result.identical:
        assert _compared(damaged / "trace.jsonl") == _compared(recorded / "trace.jsonl")


@FUZZ
@given(
    line=st.integers(0, 9),
    field=st.sampled_from(["step", "loss", "params", "rng", "lr", "time", "skipped", "grads"]),
    value=json_values,
)
def test_one_field_of_one_trace_record_set_to_any_json_value(
    recorded, tmp_path, line, field, value
):
    damaged = _copy(recorded, tmp_path, "b")
    lines = damaged.joinpath("trace.jsonl").read_text().splitlines()
    record = json.loads(lines[line])
    record[field] = value
    lines[line] = json.dumps(record, allow_nan=True)
    damaged.joinpath("trace.jsonl").write_text("\n".join(lines) + "\n")
    result = _survives(lambda: compare_runs(recorded, damaged))
    if result is not None and result.identical:  # only if the value changed nothing compared
        assert _compared(damaged / "trace.jsonl") == _compared(recorded / "trace.jsonl")


@FUZZ
@given(record=json_values)
def test_a_trace_line_of_any_json_value(recorded, tmp_path, record):
    damaged = _copy(recorded, tmp_path, "b")
    with damaged.joinpath("trace.jsonl").open("a") as handle:
        handle.write(json.dumps(record, allow_nan=True) + "\n")
    result = _survives(lambda: compare_runs(recorded, damaged))
    assert result is None or not result.identical


@pytest.mark.parametrize(
    "step", ['"3"', "null", "-1", "NaN", "1e999", "1" + "0" * 400, "3.0", "true"]
)
def test_a_malformed_step_is_an_error_from_diff_and_verify(recorded, tmp_path, step):
    damaged = _copy(recorded, tmp_path, "b")
    lines = damaged.joinpath("trace.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"step":3', f'"step":{step}')
    damaged.joinpath("trace.jsonl").write_text("\n".join(lines) + "\n")
    for command in (("diff", recorded, damaged), ("verify", damaged)):
        result = twice(*command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stdout)
        assert "error: trace" in result.stderr and "line 4" in result.stderr
        assert "Traceback" not in result.stderr and "identical" not in result.stdout


def test_a_duplicated_step_is_an_error(recorded, tmp_path):
    damaged = _copy(recorded, tmp_path, "b")
    lines = damaged.joinpath("trace.jsonl").read_text().splitlines()
    lines.insert(3, lines[2])
    damaged.joinpath("trace.jsonl").write_text("\n".join(lines) + "\n")
    result = twice("diff", recorded, damaged, cwd=tmp_path)
    assert result.returncode == 2 and "must strictly increase" in result.stderr


# -- manifests, and every command that reads one ----------------------------------------------


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), json_values.map(_dumps)))
def test_manifest_of_arbitrary_content(recorded, tmp_path, data):
    damaged = _copy(recorded, tmp_path, "b")
    damaged.joinpath("manifest.json").write_bytes(data)
    _survives(lambda: read_manifest(damaged))
    _survives(lambda: summarize_run(damaged))
    result = _survives(lambda: compare_runs(recorded, damaged))
    assert result is None or read_manifest(damaged).identity == read_manifest(recorded).identity


@FUZZ
@given(
    path=st.sampled_from(
        [
            "identity",
            "context",
            "identity.argv",
            "identity.seed",
            "identity.env",
            "context.launcher",
            "context.status",
            "context.cwd",
        ]
    ),
    value=json_values,
)
def test_one_manifest_key_set_to_any_json_value(recorded, tmp_path, path, value):
    damaged = _copy(recorded, tmp_path, "b")
    manifest = json.loads(damaged.joinpath("manifest.json").read_text())
    *parents, key = path.split(".")
    target = manifest
    for parent in parents:
        target = target[parent]
    target[key] = value
    damaged.joinpath("manifest.json").write_text(json.dumps(manifest, allow_nan=True))
    _survives(lambda: summarize_run(damaged))
    _survives(lambda: compare_runs(recorded, damaged))


_DAMAGED_MANIFESTS = {
    "list": "[]",
    "null": "null",
    "empty": "{}",
    "argv-number": None,
    "launcher-pid-huge": None,
    "deep": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("variant", sorted(_DAMAGED_MANIFESTS))
@pytest.mark.parametrize("command", ["show", "diff", "verify", "report", "nan", "locate"])
def test_every_command_refuses_a_damaged_manifest_with_an_error(
    recorded, tmp_path, variant, command
):
    damaged = _copy(recorded, tmp_path, "b")
    text = _DAMAGED_MANIFESTS[variant]
    if text is None:
        manifest = json.loads(damaged.joinpath("manifest.json").read_text())
        if variant == "argv-number":
            manifest["identity"]["argv"] = 7
        else:
            manifest["context"]["launcher"]["pid"] = 2**40
        text = json.dumps(manifest)
    damaged.joinpath("manifest.json").write_text(text)
    args = {
        "show": ("show", damaged),
        "diff": ("diff", recorded, damaged),
        "verify": ("verify", damaged),
        "report": ("report", recorded, damaged, "-o", tmp_path / "r.html"),
        "nan": ("nan", damaged),
        "locate": ("locate", recorded, damaged),
    }[command]
    result = (
        twice(*args, "--yes", cwd=tmp_path)
        if command in ("verify", "locate")
        else twice(*args, cwd=tmp_path)
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and "hint: " in result.stderr
    assert "Traceback" not in result.stderr


# -- checkpoints ------------------------------------------------------------------------------


def _reseal(folder):
    """Recompute every digest and size in a checkpoint's index, as a crafter would."""
    index = json.loads(folder.joinpath("checkpoint.json").read_text())
    index.pop("self", None)
    for name in ("tensors.safetensors", "state.json"):
        data = folder.joinpath(name).read_bytes()
        index["files"][name] = {"size": len(data), "digest": xxhash.xxh3_128_hexdigest(data)}
    folder.joinpath("checkpoint.json").write_bytes(index_bytes(index))


def _load(folder):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    return checkpoint.load(folder, strict=False, model=model)


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), json_values.map(_dumps)))
def test_checkpoint_index_of_arbitrary_content_is_never_valid(recorded, tmp_path, data):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    folder.joinpath("checkpoint.json").write_bytes(data)
    with pytest.raises(TwiceError):
        checkpoint.verify(folder)
    with pytest.raises(TwiceError):
        _load(folder)


@FUZZ
@given(state=json_values)
def test_crafted_state_with_matching_digests_loads_or_is_a_checkpoint_error(
    recorded, tmp_path, state
):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    folder.joinpath("state.json").write_bytes(_dumps(state))
    _reseal(folder)
    _survives(lambda: _load(folder))


@FUZZ
@given(
    entry=st.sampled_from(["model", "optimizer", "loader", "__rng__", "__counters__"]),
    value=json_values,
)
def test_one_crafted_state_entry_loads_or_is_a_checkpoint_error(recorded, tmp_path, entry, value):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    state = json.loads(folder.joinpath("state.json").read_text())
    state["entries"][entry] = value
    folder.joinpath("state.json").write_bytes(_dumps(state))
    _reseal(folder)
    _survives(lambda: _load(folder))


@FUZZ
@given(data=st.binary(max_size=300))
def test_crafted_safetensors_with_matching_digests_is_a_checkpoint_error(recorded, tmp_path, data):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    folder.joinpath("tensors.safetensors").write_bytes(data)
    _reseal(folder)
    with pytest.raises(TwiceError):
        _load(folder)


@pytest.mark.parametrize(
    "header",
    [
        {"w": {"dtype": "F32", "shape": [2**31, 2**31], "data_offsets": [0, 16]}},
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 2**62]}},
        {"w": {"dtype": "NOPE", "shape": [4], "data_offsets": [0, 16]}},
    ],
)
def test_crafted_safetensors_headers_are_checkpoint_errors(recorded, tmp_path, header):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    body = json.dumps(header).encode()
    folder.joinpath("tensors.safetensors").write_bytes(
        len(body).to_bytes(8, "little") + body + bytes(16)
    )
    _reseal(folder)
    with pytest.raises(TwiceError):
        _load(folder)


def test_a_dtype_naming_a_torch_function_is_refused(recorded, tmp_path):
    folder = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "c")
    state = json.loads(folder.joinpath("state.json").read_text())
    state["entries"]["extra"] = {"__dtype__": "load"}
    folder.joinpath("state.json").write_bytes(_dumps(state))
    index = json.loads(folder.joinpath("checkpoint.json").read_text())
    index["entries"]["extra"] = "value"
    folder.joinpath("checkpoint.json").write_text(json.dumps(index))
    _reseal(folder)
    with pytest.raises(TwiceError, match="dtype 'load'"):
        _load(folder)


@pytest.mark.parametrize("part", ["../good", "/tmp", "rank-00001", "rank-0"])
def test_a_rank_index_naming_a_part_outside_its_folder_is_refused(recorded, tmp_path, part):
    folder = tmp_path / "ranks"
    folder.mkdir()
    good = _copy(recorded / "checkpoints" / "step-00000004", tmp_path, "good")
    digest = xxhash.xxh3_128_hexdigest(good.joinpath("checkpoint.json").read_bytes())
    body = {"format": "twice-checkpoint-ranks/2", "world_size": 1, "parts": {part: digest}}
    folder.joinpath("checkpoint.json").write_bytes(index_bytes(body))
    with pytest.raises(TwiceError):
        checkpoint.verify(folder)


# -- the other records --------------------------------------------------------------------------


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), json_values.map(lambda v: _dumps(v) + b"\n")))
def test_op_log_numerics_metrics_resume_and_sweep_files_of_arbitrary_content(
    recorded, tmp_path, data
):
    damaged = _copy(recorded, tmp_path, "b")
    (ops,) = sorted((damaged / "ops").glob("ops*.jsonl"))
    for name in (
        "numerics.jsonl",
        "numerics.json",
        "metrics.jsonl",
        "metrics.json",
        "resumed.json",
    ):
        damaged.joinpath(name).write_bytes(data)
    ops.write_bytes(data)
    _survives(lambda: read_oplog(ops))
    _survives(lambda: read_numerics(damaged))
    _survives(lambda: read_resume(damaged))
    _survives(lambda: read_metric(damaged, "final_loss"))
    _survives(lambda: compare_runs(recorded, damaged))
    sweep = tmp_path / "sweep"
    sweep.mkdir(exist_ok=True)
    sweep.joinpath(SWEEP_FILE).write_bytes(data)
    _survives(lambda: sweep_results(sweep))
