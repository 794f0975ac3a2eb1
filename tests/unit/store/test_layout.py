"""The run folder's layout: every file name spelled in one place, and the trace streams named
only from trace files' names."""

from twice.store.layout import RunFolder


def test_the_layout_names_every_file_of_a_run_folder(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.manifest.name == "manifest.json" and folder.trace().name == "trace.jsonl"
    assert (
        folder.trace("rank1").name == "trace.rank1.jsonl" and folder.trace("main") == folder.trace()
    )
    assert folder.op_log("fork0") == tmp_path / "ops" / "ops.fork0.jsonl"
    assert folder.dumped_output(3, 7) == tmp_path / "ops" / "step-3-op-7.safetensors"
    for name in ("trace.jsonl", "trace.rank0.jsonl", "trace.rank0.fork1.jsonl", "other.jsonl"):
        (tmp_path / name).write_text("")
    assert folder.traces() == {
        "main": tmp_path / "trace.jsonl",
        "rank0": tmp_path / "trace.rank0.jsonl",
        "rank0.fork1": tmp_path / "trace.rank0.fork1.jsonl",
    }


def test_a_run_folder_names_streams_only_from_trace_names(tmp_path):
    names = ("trace.jsonl", "trace.rank1.jsonl", "trace.fork2.jsonl", "trace.rank0.sub1.jsonl")
    strays = ("trace_orig.jsonl", "trace~.jsonl", "traceX.jsonl", "trace.main.jsonl")
    strays += ("trace..jsonl",)
    for name in names + strays:
        (tmp_path / name).write_text("")
    assert set(RunFolder(tmp_path).traces()) == {"main", "rank1", "fork2", "rank0.sub1"}
    assert RunFolder(tmp_path).traces()["main"].name == "trace.jsonl"
