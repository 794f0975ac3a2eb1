"""app/listing (`twice ls`): the runs and sweeps of a runs folder as a table."""

from twice.app.listing import format_run_table, summarize_sweeps
from twice.store.files import write_json_atomic
from twice.store.sweeps import SWEEP_FILE, SweepSpec
from unit.app.folders import steps, write_run


def test_the_run_table_shows_names_reruns_loss_faults_and_sweeps():
    row = {
        "id": "20261203-a",
        "status": "completed",
        "exit_code": 0,
        "steps": 12,
        "seed": 0,
        "started": None,
        "command": "python train.py",
    }
    named = {
        **row,
        "id": "20261203-101112-131-abcdef-base",
        "name": "base",
        "duration": 75.0,
        "final_loss": 0.25,
        "loss_fault": {"step": 4, "value": "inf", "nan_from": 5},
    }
    rerun = {**row, "id": "20261203-101113-000-fedcba-verify-x", "rerun_of": "verify of x"}
    sweep = {
        "sweep": "sweep-lr-1",
        "grid": {"lr": ["0.1", "0.2"]},
        "seeds": 2,
        "trials": 4,
        "statuses": {"completed": 3, "failed": 1},
    }
    table = format_run_table([row, named, rerun], [sweep], width=140).splitlines()
    assert table[0].split() == [
        "run",
        "id",
        "status",
        "started",
        "took",
        "steps",
        "final",
        "loss",
        "command",
    ]
    assert table[2].split() == [
        "-",
        "20261203-a",
        "completed",
        "?",
        "-",
        "12",
        "-",
        "python",
        "train.py",
    ]
    assert table[3].split() == [
        "base", "20261203-101112-131-abcdef", "completed", "(non-finite", "loss)", "?",
        "1", "min", "15", "s", "12", "0.25", "python", "train.py",
    ]  # fmt: skip
    assert table[4].startswith("[verify of x]")
    assert table[5] == (
        "base: loss non-finite from step 4 (inf), NaN from step 5: see `twice nan "
        "20261203-101112-131-abcdef-base`"
    )
    assert table[6] == "sweep sweep-lr-1: lr=0.1,0.2, 2 seeds: 4 trials (3 completed, 1 failed)"


def test_each_sweep_is_summarised_by_its_trials_statuses_and_a_damaged_one_is_named(tmp_path):
    runs = tmp_path / "runs"
    sweep = runs / "sweep-lr"
    spec = SweepSpec({"lr": ["0.1", "0.2"]}, 2, ["python", "train.py"])
    sweep.mkdir(parents=True)
    write_json_atomic(sweep / SWEEP_FILE, spec.to_json())
    for name, status in (("t1", "completed"), ("t2", "completed"), ("t3", "failed")):
        write_run(sweep / "trials" / name, steps([1.0]), status=status)
    (runs / "sweep-bad").mkdir()
    (runs / "sweep-bad" / SWEEP_FILE).write_text('{"grid": 3}')
    (runs / "a-run").mkdir()  # not a sweep: not listed
    bad, good = summarize_sweeps(runs)
    assert good == {
        "sweep": "sweep-lr",
        "path": str(sweep),
        "grid": {"lr": ["0.1", "0.2"]},
        "seeds": 2,
        "trials": 4,
        "statuses": {"completed": 2, "failed": 1},
    }
    assert bad["sweep"] == "sweep-bad" and "is not a sweep spec" in bad["error"]
