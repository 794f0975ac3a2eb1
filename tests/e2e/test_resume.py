"""Bitwise resume end to end: real processes interrupted and resumed, and fault injection."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import SCRIPTS, clean_env, runs, script, twice


def test_resume_mid_epoch_with_workers_dropout_adam_scheduler_augmentation_matches_straight_run(
    tmp_path,
):
    script("resumable.py", tmp_path)
    result = twice(
        "verify-resume",
        "--at",
        "7",
        "--json",
        "--",
        sys.executable,
        "resumable.py",
        "2",
        cwd=tmp_path,
    )
    report = json.loads(result.stdout)
    assert result.returncode == 0, report
    assert report["verdict"].startswith(
        "resume is bit-exact: steps 7-19"
    )  # 10 batches per epoch: step 7 is mid-epoch
    straight = torch.load(f"{report['runs']['straight']}/final.pt")
    resumed = torch.load(f"{report['runs']['resumed']}/final.pt")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    interrupted_checkpoints = list(
        (tmp_path / "runs").glob("*-stopped-at-7/checkpoints/step-00000007")
    )
    assert len(interrupted_checkpoints) == 1


@pytest.mark.slow
def test_everything_at_once_resumes_bit_for_bit_and_matches_across_worker_counts(tmp_path):
    """AMP GradScaler, clipping, AdamW + OneCycleLR, dropout, a Dataset drawing from three RNGs, a
    MixUp collate_fn and persistent workers: resumed mid-epoch bit for bit, and the same training
    with 0 and 3 workers."""
    script("everything.py", tmp_path)
    result = twice(
        "verify-resume", "--at", "13", "--", sys.executable, "everything.py", "2", cwd=tmp_path
    )
    assert result.returncode == 0 and result.stdout.startswith(
        "resume is bit-exact: steps 13-39"
    ), result.stdout
    for workers in ("0", "3"):
        assert (
            twice(
                "run",
                "--name",
                f"w{workers}",
                "--",
                sys.executable,
                "everything.py",
                workers,
                cwd=tmp_path,
            ).returncode
            == 0
        )
    w0, w3 = (next((tmp_path / "runs").glob(f"*-w{w}")) for w in ("0", "3"))
    shown = twice("diff", w0, w3, cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith(
        "runs are bit-identical: 40 steps compared"
    ), shown.stdout
    assert (w0 / "final.pt").read_bytes() == (w3 / "final.pt").read_bytes()


def test_a_script_that_saves_no_rng_state_is_named_by_verify_resume(tmp_path):
    script("forgets_rng.py", tmp_path)
    result = twice(
        "verify-resume", "--at", "5", "--", sys.executable, "forgets_rng.py", cwd=tmp_path
    )
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == "resume differs: first divergence at step 5 (the first resumed step) (RNG state)"
    )
    assert lines[1] == "cause: the RNG state was not restored (torch)"


def test_twice_run_resume_continues_a_run_from_its_checkpoints(tmp_path):
    script("resumable.py", tmp_path)
    # An interrupted run (stopped after 4 steps, checkpointing on the way out) ...
    stopped = twice(
        "run",
        "--max-steps",
        "4",
        "--name",
        "first",
        "--",
        sys.executable,
        "resumable.py",
        "0",
        cwd=tmp_path,
    )
    assert stopped.returncode == 0, stopped.stderr
    first = runs(tmp_path)[0]
    assert (first / "checkpoints" / "step-00000004").is_dir()
    # ... continued with --resume: the new run's trace starts at step 4.
    assert (
        twice(
            "run", "--resume", first, "--", sys.executable, "resumable.py", "0", cwd=tmp_path
        ).returncode
        == 0
    )
    second = runs(tmp_path)[1]
    first_step = json.loads((second / "trace.jsonl").read_text().splitlines()[0])["step"]
    assert first_step == 4


def test_resume_from_a_missing_place_is_a_clear_error(tmp_path):
    result = twice("run", "--resume", "nowhere", "--", "true", cwd=tmp_path)
    assert result.returncode == 2 and "error: nothing to resume from at nowhere" in result.stderr


@pytest.mark.slow
def test_fault_injection_kill_9_during_checkpoint_writes_never_leaves_a_bad_latest_checkpoint(
    tmp_path,
):
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "fault_harness.py"), str(tmp_path / "ckpt"), "55"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["killed_mid_run"] == 55 and report["trials"] >= 55
    assert report["failures"] == []
    assert report["valid"] == report["matched"] == report["trials"]
    assert (
        len(report["leftover_temporaries"]) <= 1
    )  # a killed writer's temporary is swept by the next save


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_verify_resume_at_on_a_recorded_run_uses_it_as_the_uninterrupted_run(tmp_path):
    """`twice verify RUN --resume-at STEP`: the recorded run is the straight one (not run again);
    a script that forgets the RNG is named, a resumable one is bit-exact."""
    script("forgets_rng.py", tmp_path)
    assert (
        twice(
            "run", "--name", "forgets", "--", sys.executable, "forgets_rng.py", cwd=tmp_path
        ).returncode
        == 0
    )
    [recorded] = runs(tmp_path)
    result = twice("verify", str(recorded), "--resume-at", "5", "--json", cwd=tmp_path)
    outcome = json.loads(result.stdout)
    assert result.returncode == 1 and outcome["cause"] == "the RNG state was not restored (torch)"
    assert (
        outcome["runs"]["straight"] == str(recorded.resolve()) and len(runs(tmp_path)) == 3
    )  # stopped, resumed

    wrong = twice("verify", str(recorded), "--resume-at", "5", "--steps", "3", cwd=tmp_path)
    assert (
        wrong.returncode == 2
        and "error: --steps and --resume-at check different things" in wrong.stderr
    )
    assert (
        twice(
            "run",
            "--name",
            "cut",
            "--max-steps",
            "4",
            "--",
            sys.executable,
            "forgets_rng.py",
            cwd=tmp_path,
        ).returncode
        == 0
    )
    cut = max(runs(tmp_path), key=lambda p: p.name)  # run folders are named by start time
    partial = twice("verify", str(cut), "--resume-at", "2", cwd=tmp_path)
    assert partial.returncode == 2 and "was stopped after 4 steps" in partial.stderr
    outside = twice("verify", str(recorded), "--resume-at", "40", cwd=tmp_path)
    assert (
        outside.returncode == 2
        and "error: --resume-at 40 is outside the run's 12 steps" in outside.stderr
    )


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_step_index_counts_completed_steps_and_every_checkpoint_resumes_to_the_same_weights(
    tmp_path,
):
    """`run.step_index` is 0 before the first optimizer step and 1 after it (it once read 0, 2,
    3, ...); so `step-0000000N` holds the state after N updates, and resuming from *each*
    checkpoint the straight run wrote gives its final weights bit for bit."""
    script("every_checkpoint.py", tmp_path)
    straight = twice(
        "run", "--name", "straight", "--", sys.executable, "every_checkpoint.py", cwd=tmp_path
    )
    assert straight.returncode == 0, straight.stderr
    (folder,) = runs(tmp_path)
    assert json.loads((folder / "indexes.json").read_text()) == list(range(11))
    checkpoints = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert checkpoints == [f"step-{n:08d}" for n in (2, 4, 6, 8, 10)]
    final = torch.load(folder / "final.pt")
    for name in checkpoints[:-1]:
        resumed = twice(
            "run",
            "--name",
            f"from-{name}",
            "--resume",
            folder / "checkpoints" / name,
            "--",
            sys.executable,
            "every_checkpoint.py",
            cwd=tmp_path,
        )
        assert resumed.returncode == 0, resumed.stderr
        (other,) = [p for p in runs(tmp_path) if p.name.endswith(f"from-{name}")]
        start = int(name.split("-")[1])
        assert json.loads((other / "indexes.json").read_text()) == list(range(start, 11))
        weights = torch.load(other / "final.pt")
        assert all(torch.equal(final[k], weights[k]) for k in final), name
        compared = twice("diff", folder, other, cwd=tmp_path)
        assert compared.returncode == 0, compared.stdout


def test_step_index_with_two_optimizers_counts_rounds(tmp_path):
    """A GAN-like loop (two optimizers a step): the index counts rounds, 1 after the first."""
    import twice

    seen = []
    with twice.Run(runs_dir=tmp_path, determinism="warn") as run:
        d, g = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
        od, og = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.SGD(g.parameters(), lr=0.1)
        seen.append(run.step_index)
        for _ in range(3):
            for model, opt in ((d, od), (g, og)):
                opt.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
            seen.append(run.step_index)
    assert seen == [0, 1, 2, 3]


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_diff_of_a_resumed_run_names_the_resume_not_nondeterminism(tmp_path):
    """B resumed from a checkpoint without its optimizer: the diff says B resumed, and that the
    first resumed step shows what the resume did not restore."""
    script("every_checkpoint.py", tmp_path)
    twice("run", "--name", "straight", "--", sys.executable, "every_checkpoint.py", cwd=tmp_path)
    (straight,) = runs(tmp_path)
    (tmp_path / "forget-optimizer").touch()
    twice(
        "run",
        "--name",
        "resumed",
        "--resume",
        straight / "checkpoints" / "step-00000004",
        "--",
        sys.executable,
        "every_checkpoint.py",
        cwd=tmp_path,
    )
    (resumed,) = [p for p in runs(tmp_path) if p != straight]
    result = twice("diff", straight, resumed, "--json", cwd=tmp_path)
    outcome = json.loads(result.stdout)
    assert result.returncode == 1
    assert outcome["divergence"]["step"] == 4 and outcome["divergence"]["first"] == "params"
    assert outcome["explanation"] == (
        "run B resumed from step-00000004; first divergence at the first resumed step: the resume "
        "did not restore the optimizer's state (parameters differ first)"
    )
    assert "nondeterminism" not in outcome["explanation"]
