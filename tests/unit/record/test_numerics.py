"""record/numerics: the watch that finds where a NaN or Inf really comes from (its op, phase,
module and line) and the saturation before it, with no false alarms."""

import json
import math

import pytest
import torch

from twice.record import hooks, numerics
from twice.store.layout import RunFolder


@pytest.fixture
def recorder(tmp_path):
    rec = hooks.install(hooks.Recorder(tmp_path))
    yield rec
    hooks.uninstall()


def catch(function):
    with pytest.raises(numerics.NonFiniteError) as caught:
        with numerics.watch():
            function()
    return caught.value.report


def test_a_nan_made_in_forward_by_log_of_zero_is_named(recorder):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.log(torch.relu(self.lin(x)))

    model = Model()
    with torch.no_grad():
        model.lin.bias.fill_(-10.0)
    report = catch(lambda: model(torch.ones(2, 3)))
    fault = report["fault"]
    assert (
        fault["op"].startswith("aten::log")
        and fault["phase"] == "forward"
        and fault["value"] == "Inf"
    )
    assert fault["module"] == "Model" and fault["inputs"][0]["all_zero"]
    assert any(e["kind"] == "log_of_zero" for e in report["chain"])


def test_a_nan_made_in_backward_by_sqrt_at_zero_is_named(recorder):
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()

    def step():
        torch.sqrt(lin(torch.ones(1, 2))).sum().backward()

    fault = catch(step)["fault"]
    assert fault["phase"] == "backward" and fault["node"] == "SqrtBackward0"
    assert fault["line"] is not None and fault["line"].startswith(
        "tests/unit/record/test_numerics.py:"
    )


def test_a_nan_made_in_the_optimizer_by_an_infinite_learning_rate_is_named(recorder):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float("inf"), foreach=False)

    def step():
        opt.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        opt.step()

    report = catch(step)
    assert report["fault"]["phase"] == "optimizer"
    assert any(e["kind"] == "bad_scalar" and "inf" in e["summary"] for e in report["chain"])


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_no_false_alarms_on_a_healthy_run_of_hundreds_of_steps(recorder):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 8), torch.randint(0, 3, (128,))
    with numerics.watch(mode="warn") as watch:
        for _ in range(300):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    recorder.finish()
    assert watch.report is None and watch.log.events == []
    assert recorder.checks.health_log is None or recorder.checks.health_log.log.events == []


def test_a_tensor_is_described_by_what_is_wrong_with_it():
    values = torch.tensor([0.0, 0.0, 1e-40, 1e31, math.inf, math.nan, -2.0])
    assert numerics.describe(values) == {
        "shape": [7],
        "dtype": "float32",
        "zeros": 2,
        "all_zero": False,
        "tiny": 1,
        "huge": 1,
        "inf": 1,
        "nan": 1,
        "min": -2.0,
        "max": float(torch.tensor(1e31)),
    }
    assert numerics.describe(torch.zeros(3))["all_zero"]
    assert numerics.describe(torch.arange(3)) == {"shape": [3], "dtype": "int64"}


def test_the_warn_mode_reports_the_fault_and_lets_the_run_go_on(tmp_path):
    with numerics.watch(mode="warn", run_dir=tmp_path) as watch:
        out = torch.log(torch.zeros(2)) * 0  # -inf * 0 is NaN
    assert out.isnan().all() and watch.report["fault"]["op"].startswith("aten::log")
    written = json.loads(RunFolder(tmp_path).numerics_report.read_text())
    assert written["fault"] == watch.report["fault"]
    assert numerics.active_watch() is None  # stopped with the block
