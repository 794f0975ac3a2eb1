"""Environment facts, one function each: variables by name and digest, the numerical settings,
the interpreter and the machine, and the git state as a commit and a patch that leaves the
user's index alone."""

import subprocess
import sys

import pytest

from twice.runtime.capture import (
    cpu_facts,
    env_digests,
    git_state,
    numeric_env,
    os_facts,
    package_files_facts,
    python_facts,
)


def test_the_environment_is_recorded_by_name_and_digest_never_by_value():
    from twice.runtime.capture import env_digests

    secret = "hunter2-" + "x" * 20
    found = env_digests({"LR": "0.1", "API_TOKEN": secret, "SSH_TTY": "/dev/pts/1", "PWD": "/x"})
    assert set(found) == {"LR", "API_TOKEN"}  # a shell's session variables are left out
    assert secret not in str(found) and len(found["API_TOKEN"]) == 16
    assert env_digests({"LR": "0.2"})["LR"] != found["LR"]


def test_the_variables_that_change_numbers_are_kept_by_value_and_twices_own_left_out():
    environ = {"OMP_NUM_THREADS": "4", "MKL_CBWR": "AVX2", "HOME": "/h", "TWICE_SEED": "1"}
    found = numeric_env(environ)
    assert found["OMP_NUM_THREADS"] == "4" and "HOME" not in found and "TWICE_SEED" not in found
    assert "TWICE_SEED" not in env_digests(environ)


def test_the_interpreter_and_the_machine_are_described():
    assert python_facts()["executable"] == sys.executable
    assert python_facts()["version"] == ".".join(map(str, sys.version_info[:3]))
    assert os_facts()["machine"] and isinstance(cpu_facts(), dict)


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A real git repository with one commit."""
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "train.py").write_text("lr = 0.1\n")
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_checkout_is_its_commit_and_no_patch(repo):
    facts, patch = git_state(repo)
    assert facts["branch"] == "main" and len(facts["commit"]) == 40
    assert facts["dirty"] is False and patch == "" and facts["untracked_by_digest"] == []
    assert git_state(repo.parent / "elsewhere-not-a-repo") == (None, "")


def test_edits_and_new_files_are_the_patch_and_the_users_index_is_untouched(repo):
    (repo / "train.py").write_text("lr = 0.2\n")
    (repo / "model.py").write_text("layers = 3\n")
    (repo / "weights.bin").write_bytes(b"\0" * 100)
    (repo / "runs").mkdir()
    (repo / "runs" / "log.txt").write_text("excluded")
    index_before = (repo / ".git" / "index").read_bytes()
    facts, patch = git_state(repo, exclude=[repo / "runs"])
    assert facts["dirty"] and "+lr = 0.2" in patch and "+layers = 3" in patch
    assert "log.txt" not in patch and "weights.bin" not in patch
    assert [(e["path"], e["size"]) for e in facts["untracked_by_digest"]] == [("weights.bin", 100)]
    assert (repo / ".git" / "index").read_bytes() == index_before
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True)
    assert b"?? model.py" in status.stdout  # still untracked: nothing was added for the user


def test_a_package_is_its_files_digest_from_its_record(tmp_path):
    for name, body in (("a", b"x = 1"), ("b", b"x = 2")):
        info = tmp_path / name / "mylib-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 1.0\n")
        (info / "RECORD").write_bytes(
            b"mylib/__init__.py,sha256=" + body + b",5\nmylib-1.0.dist-info/RECORD,,\n"
        )
    a, b = (package_files_facts([str(tmp_path / n)]) for n in ("a", "b"))
    assert set(a) == {"mylib"} and a != b and len(a["mylib"]) == 16
