"""Scripts that resume themselves (their own torch.save and --resume flag): lined up by content."""

import json
import sys

import pytest
from conftest import runs, script, twice


def _run(folder, name: str, *args: str):
    result = twice("run", "--name", name, "--", sys.executable, "self_resume.py", *args, cwd=folder)
    assert result.returncode == 0, result.stderr
    return runs(folder)[-1]


def test_a_self_resumed_run_is_found_in_the_straight_run_and_compared_from_there(tmp_path):
    script("self_resume.py", tmp_path)
    straight = _run(tmp_path, "straight", "--with-rng")
    _run(tmp_path, "stopped", "--with-rng", "--stop-after", "4")
    resumed = _run(tmp_path, "resumed", "--with-rng", "--resume", "ckpt.pt")
    diff = twice("diff", straight, resumed, cwd=tmp_path)
    assert diff.returncode == 0, diff.stdout
    assert diff.stdout.startswith(
        "runs are bit-identical: 6 steps compared; B starts at A's step 4 (parameters identical)"
    )
    # The other way round: A is the resumed run.
    assert "A starts at B's step 4" in twice("diff", resumed, straight, cwd=tmp_path).stdout

    # A checkpoint without the RNG state: the first resumed step says what was lost.
    _run(tmp_path, "stopped-norng", "--stop-after", "4")
    lost = _run(tmp_path, "norng", "--resume", "ckpt.pt")
    diff = twice("diff", straight, lost, cwd=tmp_path)
    assert diff.returncode == 1
    assert "first divergence at step 4 (RNG state)" in diff.stdout
    assert (
        "B starts at A's step 4 (parameters identical); first divergence at the first resumed "
        "step: the resume did not restore the RNG state" in diff.stdout
    )
    # By hand, the same; an offset that does not fit is simply a difference at its first step.
    by_hand = json.loads(
        twice("diff", straight, lost, "--offset", "4", "--json", cwd=tmp_path).stdout
    )
    assert by_hand["divergence"]["step"] == 4 and by_hand["divergence"]["first"] == "rng"
    wrong = json.loads(
        twice("diff", straight, resumed, "--offset", "3", "--json", cwd=tmp_path).stdout
    )
    assert wrong["identical"] is False and wrong["divergence"]["step"] == 3


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_verify_resume_with_the_scripts_own_resume_command(tmp_path):
    script("self_resume.py", tmp_path)
    kept = twice(
        "verify-resume",
        "--at",
        "6",
        "--resume-command",
        f"{sys.executable} self_resume.py --with-rng --resume ckpt.pt",
        "--",
        sys.executable,
        "self_resume.py",
        "--with-rng",
        cwd=tmp_path,
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "resume is bit-exact: steps 6-9" in kept.stdout
    lost = twice(
        "verify-resume",
        "--resume-command",
        f"{sys.executable} self_resume.py --resume ckpt.pt",
        "--json",
        "--",
        sys.executable,
        "self_resume.py",
        cwd=tmp_path,
    )
    assert lost.returncode == 1
    check = json.loads(lost.stdout)
    assert check["at"] == 5 and check["divergence"]["first"] == "rng"
    assert "RNG state was not restored" in check["cause"]
    bad = twice("verify-resume", "--resume-command", "'", "--", "python", "x.py", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --resume-command")
