"""twice.testing's pytest plugin, in real pytest processes (the assertions themselves:
tests/unit/app/test_testing.py)."""

import subprocess
import sys

import pytest
from conftest import clean_env


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_the_pytest_plugin_offers_the_update_flag_and_fixture(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "import torch\nfrom twice.testing import assert_matches_golden\n"
        "def train():\n    m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    for _ in range(3):\n        o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); "
        "o.step()\n"
        "def test_golden(twice_update_golden):\n"
        "    assert_matches_golden(train, 'golden.jsonl', update=twice_update_golden)\n"
    )
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],  # noqa: E731
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    updated = run("--twice-update-golden")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert (tmp_path / "golden.jsonl").is_file()
    assert run().returncode == 0
    # From another folder the golden file is still the one beside the test file.
    elsewhere = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path.parent,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    assert not (tmp_path.parent / "golden.jsonl").exists()
