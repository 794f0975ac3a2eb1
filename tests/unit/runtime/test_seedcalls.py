"""The script's own seeding calls recorded by line, with a digest of their values; seeding from
OS entropy counted as such. The wrappers stay for a process's life: a process of its own."""

import json
import subprocess
import sys

from twice.runtime import seedcalls

SCRIPT = """import json, sys
from twice.runtime.seedcalls import recorded, watch_random
watch_random()
import random
random.seed(int(sys.argv[1]))
random.Random(4)
random.seed()
print(json.dumps(recorded()))
"""


def _record(tmp_path, seed):
    (tmp_path / "seeds.py").write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, "seeds.py", str(seed)], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_each_call_is_recorded_at_its_line_with_a_digest_of_its_values(tmp_path):
    first, again, other = _record(tmp_path, 3), _record(tmp_path, 3), _record(tmp_path, 5)
    calls = {(c["api"], c["site"]): c for c in first["calls"]}
    assert set(calls) == {
        ("random.seed", "seeds.py:5"),
        ("random.Random", "seeds.py:6"),
        ("random.seed", "seeds.py:7"),
    }
    assert calls[("random.seed", "seeds.py:7")]["entropy"] == 1  # no seed: OS entropy
    assert calls[("random.seed", "seeds.py:7")]["values"] is None
    assert calls[("random.seed", "seeds.py:5")]["entropy"] == 0
    assert {"random.seed", "random.Random", "random.Random.seed"} <= set(first["watched"])
    assert first == again and first != other


def test_a_seed_given_through_another_function_is_recorded_at_that_functions_line(monkeypatch):
    import random

    monkeypatch.setattr(random, "seed", random.seed)  # the wrappers go again after the test
    monkeypatch.setattr(random.Random, "seed", random.Random.__dict__["seed"])
    monkeypatch.setattr(seedcalls, "_calls", {})
    monkeypatch.setattr(seedcalls, "_watched", set())
    seedcalls.watch_random()

    def seed_all(value):
        random.seed(value)  # the line recorded: the caller's own code

    line = seed_all.__code__.co_firstlineno + 1
    seed_all(11)
    seed_all(11)
    (call,) = seedcalls.recorded()["calls"]
    assert call["api"] == "random.seed" and call["site"].endswith(f"test_seedcalls.py:{line}")
    assert (call["calls"], call["entropy"]) == (2, 0) and call["values"]
