"""app/trust: a run folder's command is re-run unasked only where this user's twice signed it, and
of its recorded environment only the allow-listed numerics switches are applied again."""

import os

import pytest

from twice.app.trust import (
    REPLAYED,
    Rerun,
    UntrustedRun,
    admit,
    foreign_reason,
    key_path,
    replayable_env,
    sign_manifest,
    trusted_rerun,
)
from twice.core.manifest import Manifest
from twice.store.files import write_json_atomic


@pytest.fixture
def own_key(tmp_path, monkeypatch):
    """This user's key, in a configuration folder of the test's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return key_path()


def _manifest(tmp_path, argv=("python", "train.py"), env=None) -> dict:
    return {
        "identity": {"argv": list(argv), "seed": 3, "env": env or {}},
        "context": {"status": "completed", "cwd": str(tmp_path), "steps": 4},
    }


def _folder(tmp_path, manifest: dict, name="run"):
    folder = tmp_path / name
    folder.mkdir()
    write_json_atomic(folder / "manifest.json", manifest)
    return folder


def test_a_run_this_user_signed_is_re_run_unasked_and_an_edited_one_is_refused(tmp_path, own_key):
    signed = sign_manifest(_manifest(tmp_path, env={"OMP_NUM_THREADS": "4"}))
    assert own_key.is_file() and own_key.stat().st_mode & 0o777 == 0o600  # made on first use
    rerun = trusted_rerun(_folder(tmp_path, signed))
    assert rerun.argv == ("python", "train.py") and rerun.seed == 3 and rerun.steps == 4
    assert rerun.env == (("OMP_NUM_THREADS", "4"),) and rerun.cwd == str(tmp_path)
    edited = dict(signed, identity={**signed["identity"], "argv": ["sh", "-c", "rm -rf ~"]})
    folder = _folder(tmp_path, edited, "edited")
    with pytest.raises(UntrustedRun, match=r"it would run: sh -c 'rm -rf ~'") as refused:
        trusted_rerun(folder)
    assert "its signature is not this user's" in refused.value.message
    asked = []
    assert (
        trusted_rerun(folder, yes=lambda question: asked.append(question) or True).argv[0] == "sh"
    )
    assert asked == [refused.value.message]  # the question shows what would run
    assert trusted_rerun(folder, yes=True).argv[0] == "sh"


def test_an_unsigned_folder_or_a_key_others_can_read_signs_nothing(tmp_path, own_key):
    plain = Manifest.from_json(_manifest(tmp_path), "manifest.json")
    assert "carries no signature" in foreign_reason(tmp_path, plain)
    signed = sign_manifest(_manifest(tmp_path))
    os.chmod(own_key, 0o644)
    reason = foreign_reason(tmp_path, Manifest.from_json(signed, "manifest.json"))
    assert reason == f"this user has no signing key ({own_key})"


def test_only_allow_listed_variables_with_valid_values_are_replayed():
    recorded = {
        "OMP_NUM_THREADS": "8",
        "PYTHONHASHSEED": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "LD_PRELOAD": "/tmp/evil.so",
        "BASH_ENV": "/tmp/evil.sh",
        "MKL_NUM_THREADS": "0",  # not a count
        "NCCL_ALGO": "Ring; rm -rf ~",
        "ATEN_CPU_CAPABILITY": 2,
    }
    assert replayable_env(recorded) == {
        "OMP_NUM_THREADS": "8",
        "PYTHONHASHSEED": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
    assert not {"LD_PRELOAD", "BASH_ENV", "PYTHONPATH", "CUDA_INJECTION64_PATH"} & set(REPLAYED)


def test_a_rerun_is_made_by_the_check_only(tmp_path, own_key):
    manifest = Manifest.from_json(sign_manifest(_manifest(tmp_path)), "manifest.json")
    rerun = admit(tmp_path, manifest)
    fields = {name: getattr(rerun, name) for name in rerun.__dataclass_fields__ if name != "door"}
    with pytest.raises(TypeError, match="made by the trust check only"):
        Rerun(**fields, door=None)
