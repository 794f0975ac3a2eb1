"""record/replicas: the replica check's verdict from the gathered digests, the same on every
rank."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.record.replicas import ReplicaCheck, _first_desync


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(1, 3).flatmap(
        lambda count: st.lists(
            st.lists(
                st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=count, max_size=count
            ),
            min_size=1,
            max_size=6,
        )
    )
)
def test_a_desync_is_found_exactly_where_a_group_holds_two_digests(ranks):
    """ranks[r][c] = (digest, group) of class c on rank r: a desync iff some group of some class
    holds two digests, and then the named rank's digest differs from the named reference's."""
    count = len(ranks[0])
    gathered = [[w for d, g in classes for w in (d, -d, g)] for classes in ranks]
    found = _first_desync(gathered, count)
    torn = any(
        len({ranks[r][c][0] for r in range(len(ranks)) if ranks[r][c][1] == group}) > 1
        for c in range(count)
        for group in {ranks[r][c][1] for r in range(len(ranks))}
    )
    assert (found is not None) == torn
    if found is not None:
        index, rank, reference = found
        assert ranks[rank][index][1] == ranks[reference][index][1]
        assert ranks[rank][index][0] != ranks[reference][index][0] and reference < rank


def test_outside_a_process_group_of_several_ranks_the_check_does_nothing(tmp_path):
    check = ReplicaCheck(tmp_path, every=0)
    assert check.every == 1
    weight = torch.ones(2)
    for step in range(3):
        check.after_step(step, [("weight", "a" * 32)], [("weight", weight)])
    assert check.pending is None
    check.finish()
    assert list(tmp_path.iterdir()) == []  # no report written
