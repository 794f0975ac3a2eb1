"""app/recordings: what two runs recorded differently is never a verdict by itself, and what it
leaves to compare."""

from twice.app.recordings import length_mismatch, recorded
from twice.core.manifest import Manifest


def _manifest(**context) -> Manifest:
    data = {
        "identity": {"argv": ["python", "train.py"], "seed": 0},
        "context": {"status": "completed", **context},
    }
    return Manifest.from_json(data, "manifest.json")


def test_recording_settings_that_differ_are_named_in_words():
    a = _manifest(recording={"trace_every": 1}, steps=10)
    b = _manifest(recording={"trace_every": 2, "max_steps": 6}, steps=6)
    found = recorded(a, b, [], None)
    assert [(d.key, d.a, d.b) for d in found.differences] == [
        ("--trace-every", 1, 2),
        ("--max-steps", None, 6),
    ]
    assert found.every == (1, 2) and found.partial == frozenset()
    assert found.phrases() == ["recorded differently: --trace-every 1 vs 2, --max-steps none vs 6"]
    assert recorded(a, a, [], 4).differences == [] and recorded(a, a, [], 4).steps == 4


def test_per_tensor_digests_are_compared_only_where_both_runs_recorded_them():
    a = _manifest(recording={"trace_every": 1}, steps=10)
    every_step = _manifest(recording={"params_every": 1}, steps=10)
    found = recorded(a, every_step, [], None)
    assert found.partial == {"param_digests", "grad_digests"}
    assert found.phrases() == ["recorded differently: --params-every auto vs 1"]


def test_runs_of_another_length_differ_unless_one_resumed_or_the_limit_is_shorter():
    a, b = _manifest(steps=10), _manifest(steps=6)
    assert length_mismatch(a, b, None, resumed=False) == ["A ran 10 steps and B 6"]
    assert length_mismatch(a, b, 6, resumed=False) == []  # compared over the first 6 only
    assert length_mismatch(a, b, None, resumed=True) == []
    assert length_mismatch(a, _manifest(), None, resumed=False) == []  # a length unknown
