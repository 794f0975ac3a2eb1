"""Shared fixtures: global RNG and determinism state restored around every test; helpers to run
the CLI."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPTS = Path(__file__).parent / "e2e" / "scripts"


@pytest.fixture(autouse=True)
def restore_global_state():
    """Every test leaves torch's flags, the RNGs and os.environ as it found them."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_num_threads(),
        torch.get_float32_matmul_precision(),
    )
    environ = dict(os.environ)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]
        torch.set_num_threads(flags[4])
        torch.set_float32_matmul_precision(flags[5])
        os.environ.clear()
        os.environ.update(environ)


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything twice or hashing-related, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TWICE_") and k not in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")
    }
    env.update(extra)
    return env


def twice(
    *args: str,
    cwd: Path,
    env: dict | None = None,
    timeout: float = 300,
    stdin=subprocess.DEVNULL,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the real `twice` command line in a subprocess. Its standard input is /dev/null
    unless `stdin` (a file) or `input` (text down a pipe) is given: `twice run` counts a pipe
    as data it cannot see, and pytest's own standard input may be one."""
    return subprocess.run(
        [sys.executable, "-m", "twice", *map(str, args)],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **({"input": input} if input is not None else {"stdin": stdin}),
    )


def script(name: str, folder: Path) -> Path:
    """Copy a test script into `folder` and return its path there."""
    target = folder / name
    target.write_text((SCRIPTS / name).read_text())
    return target


def runs(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "runs").iterdir() if (p / "manifest.json").is_file())


@pytest.fixture
def one_rank_mesh(tmp_path):
    """A gloo process group of one rank and its 1-D CPU mesh, torn down after the test."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
