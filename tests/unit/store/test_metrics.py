"""Metrics a script reports (`twice.log_metric`) and metrics read from a run: logged, written by
the script, or taken from its trace; a damaged file refused."""

import json
import os

import pytest

from twice.core.errors import CorruptRecord, UsageError
from twice.core.protocol import ChildSettings
from twice.core.records import StepRecord
from twice.store.layout import RunFolder
from twice.store.metrics import (
    available_metrics,
    log_metric,
    read_final,
    read_logged,
    read_metric,
    require_metric,
)
from twice.store.traces import TraceWriter


def test_a_metric_logged_outside_twice_run_goes_nowhere(tmp_path):
    os.environ.pop("TWICE_RUN_DIR", None)
    log_metric("accuracy", 0.5)  # nothing to write to: no error
    assert list(tmp_path.iterdir()) == []


def test_logged_metrics_read_back_the_last_value_winning_and_non_finite_kept(tmp_path):
    os.environ.update(ChildSettings(run_dir=str(tmp_path)).to_env())
    log_metric("accuracy", 0.5, step=1)
    log_metric("val_loss", float("inf"), step=1)
    log_metric("accuracy", 0.75, step=2)
    logged = read_logged(tmp_path)
    assert [(m.name, m.value, m.step) for m in logged] == [
        ("accuracy", 0.5, 1),
        ("val_loss", float("inf"), 1),
        ("accuracy", 0.75, 2),
    ]
    assert read_metric(tmp_path, "accuracy") == 0.75 and read_metric(tmp_path, "nope") is None
    with open(RunFolder(tmp_path).metrics, "a") as handle:
        handle.write('{"name": "accuracy", "val')  # a last line cut short by a kill
    assert len(read_logged(tmp_path)) == 3


def test_the_trace_gives_the_final_and_best_loss_and_metrics_json_its_own_values(tmp_path):
    writer = TraceWriter(RunFolder(tmp_path).trace())
    for step, loss in enumerate((3.0, 1.0, 2.0)):
        writer.write(StepRecord(step=step, loss=loss.hex()))
    writer.close()
    assert read_metric(tmp_path, "final_loss") == 2.0 and read_metric(tmp_path, "best_loss") == 1.0
    RunFolder(tmp_path).final_metrics.write_text(json.dumps({"bleu": 31.5, "final_loss": 9.0}))
    assert read_final(tmp_path) == {"bleu": 31.5, "final_loss": 9.0}
    assert read_metric(tmp_path, "final_loss") == 9.0  # what the script wrote comes first
    assert available_metrics(tmp_path) == {"final_loss", "best_loss", "bleu"}
    require_metric([tmp_path], "bleu")
    with pytest.raises(UsageError, match="unknown metric 'accuracy'") as raised:
        require_metric([tmp_path], "accuracy")
    assert raised.value.hint == "this sweep's runs have: best_loss, bleu, final_loss"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("metrics", '{"name": "a", "value": "high"}\n', "line 1 is not a metric record"),
        ("metrics", '{"name": "a", "value": 1, "step": 1.5}\n', "line 1 is not a metric record"),
        ("metrics", '{"name": "a", "value": NaN}\n', "NaN is not JSON"),
        ("final_metrics", '{"bleu": [31.5]}', "is not a metrics file"),
    ],
)
def test_a_damaged_metrics_file_is_a_corrupt_record(tmp_path, name, text, message):
    getattr(RunFolder(tmp_path), name).write_text(text)
    with pytest.raises(CorruptRecord, match=message):
        read_metric(tmp_path, "a")
