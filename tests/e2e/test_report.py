"""HTML reports from real small runs and a small sweep; opened in a real headless browser."""

import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from conftest import clean_env, runs, script, twice

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Collector(HTMLParser):
    """Parses the page (raising on nothing, collecting text and tags) to check its content."""

    def __init__(self):
        super().__init__()
        self.text, self.tags, self.open = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def parse(path):
    collector = Collector()
    collector.feed(path.read_text(encoding="utf-8"))
    collector.close()
    return " ".join(collector.text), collector.tags


@pytest.fixture(scope="module")
def thread_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    script("threads_reduce.py", tmp)
    for name, threads in (("one", "1"), ("two", "2")):
        result = twice(
            "run",
            "--name",
            name,
            "--",
            sys.executable,
            "threads_reduce.py",
            cwd=tmp,
            env=clean_env(OMP_NUM_THREADS=threads),
        )
        assert result.returncode == 0, result.stderr
    return tmp, runs(tmp)


def test_run_report_has_the_verdict_the_divergence_step_and_every_differing_manifest_field(
    thread_runs,
):
    tmp, (one, two) = thread_runs
    result = twice("diff", one, two, "--html", tmp / "diff.html", cwd=tmp)
    assert result.returncode == 1
    text, tags = parse(tmp / "diff.html")
    diff = json.loads(twice("diff", one, two, "--json", cwd=tmp).stdout)
    assert diff["verdict"] in text
    assert f"first divergence: step {diff['divergence']['step']}" in text
    for difference in diff["differences"]:
        assert difference["key"] in text
    assert (
        tags.count("svg") >= 2 and "script" not in tags
    )  # plots inline, no scripts: opens offline
    report = twice("report", one, two, "-o", tmp / "report.html", cwd=tmp)
    assert (
        report.returncode == 0
        and (tmp / "report.html").read_text() == (tmp / "diff.html").read_text()
    )


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_sweep_report_shows_each_arm_and_the_pairwise_verdicts(tmp_path):
    script("sweep_train.py", tmp_path)
    twice(
        "sweep",
        "--vary",
        "lr=0.05,0.2",
        "--seeds",
        "2",
        "--name",
        "s",
        "--jobs",
        "2",
        "--metric",
        "weight_error",
        "--",
        sys.executable,
        "sweep_train.py",
        "--lr",
        "{lr}",
        cwd=tmp_path,
    )
    result = twice(
        "stats", tmp_path / "runs" / "s", "--html", tmp_path / "sweep.html", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    text, tags = parse(tmp_path / "sweep.html")
    assert "lr=0.2 vs lr=0.05" in text and (
        "within seed noise" in text or "effect exceeds seed noise" in text
    )
    assert "weight_error" in text and "svg" in tags


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (make test installs it where it can)"
)
def test_the_report_opens_in_a_headless_browser_without_console_errors(thread_runs, tmp_path):
    tmp, (one, two) = thread_runs
    page = tmp_path / "report.html"
    assert twice("report", one, two, "-o", page, cwd=tmp).returncode == 0
    shot = tmp_path / "report.png"
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,1600",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file() and shot.stat().st_size > 10_000, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console


def test_the_report_has_a_panel_per_metric_a_runs_table_and_keeps_healthy_runs_readable(tmp_path):
    script("report_train.py", tmp_path)
    for name, lr in (("calm", "0.05"), ("wild", "2.0")):
        result = twice(
            "run", "--name", name, "--", sys.executable, "report_train.py", lr, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
    page = tmp_path / "r.html"
    assert twice("report", "calm", "wild", "-o", page, cwd=tmp_path).returncode == 0
    again = tmp_path / "again.html"
    assert twice("report", "calm", "wild", "-o", again, cwd=tmp_path).returncode == 0
    assert page.read_bytes() == again.read_bytes()  # the same runs, the same bytes
    html_text = page.read_text()
    text, tags = parse(page)
    # A panel per recorded metric, each with the divergence marked.
    for title in ("Loss", "Learning rate", "Gradient norm", "Val_loss"):
        assert f"<h2>{title}</h2>" in html_text, title
    panels = html_text.split("<h2>")[1:]
    plotted = [
        p
        for p in panels
        if p.split("</h2>")[0] in ("Loss", "Learning rate", "Gradient norm", "Val_loss")
    ]
    assert all("first divergence: step 0" in p for p in plotted)
    # The blown-up run is cut at the healthy range, and shown whole beside it.
    loss_panel = plotted[0]
    assert "the healthy runs" in loss_panel and "every run, its whole range" in loss_panel
    # The runs table: names first, the fault in words, the config that differs.
    table = html_text.split("<h2>Runs</h2>")[1].split("</table>")[0]
    assert table.index(">calm") < table.index(">wild")
    assert "loss non-finite from step" in table and "<code>lr</code>" in table
    assert "<code>width</code>" not in table  # the same in both runs
    assert "val_loss" in table and "script" not in tags
