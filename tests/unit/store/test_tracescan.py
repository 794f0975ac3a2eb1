"""The streaming trace comparison against a full parse: the same counts, the same first
difference and the same errors, through twice._native and through Python."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.core import digests
from twice.core.divergence import first_divergence
from twice.core.errors import CorruptRecord
from twice.core.records import StepRecord, record_line
from twice.store import tracescan
from twice.store.traces import read_trace


def _record(step: int, salt: int = 0, time: float | None = 0.5, per_tensor: bool = False):
    return StepRecord(
        step=step,
        loss=(1.0 / (step + 1) + salt).hex(),
        batch=f"{step * 7 + 1:032x}",
        grads=f"{step * 11 + salt:032x}",
        params=f"{step * 13 + salt:032x}",
        lr=[(0.1).hex()],
        rng={"torch": f"{step:032x}"},
        param_digests={"w": f"{step:032x}"} if per_tensor else None,
        time=time,
    )


def _full(path_a, path_b, steps=None, start=0):
    """The comparison as a full read made it: every record parsed, then compared."""

    def limited(records):
        return [r for r in records if start <= r.step and (steps is None or r.step < steps)]

    a, b = limited(read_trace(path_a)), limited(read_trace(path_b))
    found = first_divergence(a, b)
    common = len({r.step for r in a} & {r.step for r in b})
    return (len(a), len(b)), common, None if found is None else (found.step, found.identical_before)


def _scan(path_a, path_b, steps=None, start=0):
    scan = tracescan.scan_pair(path_a, path_b, steps, start)
    first = None if scan.first is None else (scan.first[0].step, scan.same_before)
    return tuple(scan.counts), scan.common, first


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 40),
    differ=st.sets(st.integers(0, 39), max_size=3),
    every_b=st.sampled_from([1, 1, 1, 2, 3]),
    shorter=st.integers(0, 10),
    per_tensor=st.booleans(),
    steps=st.one_of(st.none(), st.integers(0, 45)),
    start=st.sampled_from([0, 0, 3, 17]),
)
def test_a_streaming_scan_gives_what_a_full_parse_gives(
    tmp_path_factory, length, differ, every_b, shorter, per_tensor, steps, start
):
    folder = tmp_path_factory.mktemp("scan")
    a, b = folder / "a.jsonl", folder / "b.jsonl"
    a.write_bytes(b"".join(record_line(_record(s, time=s * 0.25)) for s in range(length)))
    b.write_bytes(
        b"".join(
            record_line(
                _record(s, s in differ, time=s * 0.5 + 1e-9, per_tensor=per_tensor and s == 5)
            )
            for s in range(0, max(0, length - shorter), every_b)
        )
    )
    for native in (True, False):
        saved = digests.native
        if not native:
            digests.native = None
        try:
            assert _scan(a, b, steps, start) == _full(a, b, steps, start)
        finally:
            digests.native = saved


BAD_LINES = [
    b'{"step":"3","time":1.0}\n',  # a string step
    b'{"step":2,"time":1.0}\n',  # a step that does not increase
    b'{"loss":"0x1p+0","step":3,"time":1.0',  # cut short, then more lines follow
    b'{"step":3, "time":1.0}\n{"step":3,"time":1.0}\n',  # not canonical, then a duplicate
    b'{"step":03,"time":1.0}\n',  # not JSON
]


@pytest.mark.parametrize("bad", BAD_LINES)
def test_a_damaged_line_equal_in_both_traces_is_the_error_a_full_read_gives(tmp_path, walk, bad):
    head = b"".join(record_line(_record(s)) for s in range(3))
    tail = b"".join(record_line(_record(s)) for s in range(10, 12))
    body = head + bad + (b"\n" if not bad.endswith(b"\n") else b"") + tail
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(body)
    b.write_bytes(body)
    with pytest.raises(CorruptRecord) as full:
        read_trace(a)
    with pytest.raises(CorruptRecord) as streamed:
        tracescan.scan_pair(a, b)
    assert str(streamed.value).split(":")[0] == str(full.value).split(":")[0]  # file and line


def test_a_damaged_field_where_the_traces_differ_is_an_error(tmp_path, walk):
    """Lines equal in both traces are checked for their form (a canonical tail, one step per line,
    increasing); a line that differs is parsed and validated in full."""
    good = b"".join(record_line(_record(s)) for s in range(3))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(good + b'{"batch":5,"step":3,"time":1.0}\n')
    b.write_bytes(good + record_line(_record(3)))
    with pytest.raises(CorruptRecord, match="line 4 is not a step record"):
        tracescan.scan_pair(a, b)


def test_a_difference_after_millions_of_bytes_is_found_and_the_rest_counted(tmp_path, walk):
    """Several blocks (a small BLOCK), the difference in the middle of one."""
    tracescan.BLOCK, saved = 4096, tracescan.BLOCK
    try:
        a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        a.write_bytes(b"".join(record_line(_record(s, time=s / 3)) for s in range(2000)))
        b.write_bytes(b"".join(record_line(_record(s, s == 1234, time=s / 7)) for s in range(2000)))
        assert _scan(a, b) == ((2000, 2000), 2000, (1234, 1234)) == _full(a, b)
        assert _scan(a, b, steps=10) == ((10, 10), 10, None)
    finally:
        tracescan.BLOCK = saved


def test_the_native_walk_and_the_python_walk_agree_line_for_line():
    if digests.native is None:
        pytest.skip("twice._native is not built here")
    lines = [record_line(_record(s, time=t)) for s, t in ((0, 1.0), (1, None), (2, 2.5e-7))]
    a = b"".join(lines) + b'{"step":3}\n' + b'{"x":1,"step":4,"time":-1E+3}\n' + b"{\n"
    b = b"".join(lines) + b'{"step":3}\n' + b'{"x":1,"step":4,"time":5}\n' + b"{\n"
    for args in ((0, 0, -1, -1, 2**63 - 1), (0, 0, -1, -1, 2), (0, 0, 0, -1, 2**63 - 1)):
        assert digests.native.same_lines(a, b, *args) == tracescan._same_lines_py(a, b, *args)
    # the three whole records are taken; a record holding only its step is damage, for the reader
    assert tracescan._same_lines_py(a, b, 0, 0, -1, -1, 2**63 - 1)[0] == 3
    assert json.loads(lines[1])["step"] == 1


@pytest.mark.parametrize("loss", ["0x1.0000000000000p+9999", "0x1.0000000000000p-1075"])
def test_a_float_text_no_double_holds_is_damage_on_both_paths(tmp_path, walk, loss):
    """A canonical line but for an exponent no double has: the compiled validator and the
    Python reader both refuse it (float.fromhex would overflow where it is read)."""
    good = (1.5).hex()
    line = record_line(StepRecord(step=0, loss=good)).replace(good.encode(), loss.encode())
    path = tmp_path / "t.jsonl"
    path.write_bytes(line)
    with pytest.raises(CorruptRecord, match="line 1"):
        read_trace(path)
