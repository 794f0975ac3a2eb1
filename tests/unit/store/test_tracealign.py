"""Two traces whose step numbers do not correspond (a script that resumed itself): where the later
run starts, found from its parameters, and its records compared with the other's renumbered."""

from twice.core.records import StepRecord
from twice.store.tracealign import (
    Alignment,
    content_alignment,
    find_params,
    first_record,
    scan_offset,
)
from twice.store.traces import TraceWriter


def _params(step):
    return f"{step:032x}"


def _trace(path, steps, start_state, loss_at=None):
    """A trace of `steps` steps from state `start_state`: step s ends in state start_state+s+1."""
    writer = TraceWriter(path)
    for s in range(steps):
        loss = (1.0 / (start_state + s + 1)).hex() if s != loss_at else (9.0).hex()
        before = _params(start_state) if s == 0 else None
        writer.write(
            StepRecord(step=s, loss=loss, params=_params(start_state + s + 1), params_before=before)
        )
    writer.close()
    return path


def test_a_run_resumed_by_its_own_script_is_found_where_its_starting_state_occurs(tmp_path):
    a = _trace(tmp_path / "a.jsonl", 10, 0)
    b = _trace(tmp_path / "b.jsonl", 4, 6)  # started from the state after A's step 5
    assert first_record(b).params_before == _params(6) and find_params(a, _params(6)) == 5
    found = content_alignment(a, b)
    assert found == Alignment(6, True)
    assert found.phrase() == "B starts at A's step 6 (parameters identical)"
    assert content_alignment(b, a) == Alignment(-6, True)
    assert Alignment(-3, False).phrase() == "A starts at B's step 3 (--offset)"


def test_runs_that_start_alike_or_share_no_state_need_no_alignment(tmp_path):
    a = _trace(tmp_path / "a.jsonl", 5, 0)
    assert content_alignment(a, _trace(tmp_path / "same.jsonl", 3, 0)) is None
    assert content_alignment(a, _trace(tmp_path / "far.jsonl", 3, 100)) is None
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert first_record(tmp_path / "empty.jsonl") is None
    assert content_alignment(a, tmp_path / "empty.jsonl") is None


def test_the_records_are_compared_step_against_step_renumbered(tmp_path):
    a = _trace(tmp_path / "a.jsonl", 12, 0)
    same = scan_offset(a, _trace(tmp_path / "b.jsonl", 4, 6), 6)
    # A's steps 0-5 came before B started: not steps B could have; 10 and 11 B lacks
    assert (same.common, same.first, same.only, same.counts) == (4, None, (0, 10), [6, 4])
    assert same.last_same == 9 and scan_offset(a, tmp_path / "b.jsonl", 6, steps=10).only is None
    differs = scan_offset(a, _trace(tmp_path / "c.jsonl", 4, 6, loss_at=2), 6)
    assert differs.same_before == 2 and differs.first[0].step == differs.first[1].step == 8
