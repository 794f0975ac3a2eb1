"""No process of a run outlives its launcher: killed with its parent, on Linux (real processes:
the module is about them)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from twice.runtime.orphans import parent_death_hook

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

# A parent that starts a sleeping child (by `how`) and prints the child's pid.
PARENT = """
import subprocess, sys
from twice.runtime.orphans import parent_death_hook
how = sys.argv[1]
code = "import time; time.sleep(60)"
hook = None
if how == "hook":
    hook = parent_death_hook()
else:
    code = "import os, time; from twice.runtime.orphans import die_with_parent; " \\
           "die_with_parent(os.getppid()); print('set', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code], preexec_fn=hook, stdout=subprocess.PIPE)
if how != "hook":
    child.stdout.readline()
print(child.pid, flush=True)
import time; time.sleep(60)
"""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is dead too
        return stat.read().split(") ")[1][0] != "Z"


@pytest.mark.parametrize("how", ["hook", "die_with_parent"])
def test_a_child_dies_when_its_parent_is_killed(how):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def test_a_child_started_with_the_hook_asks_for_sigkill_when_its_parent_dies():
    asked = (
        "import ctypes; libc = ctypes.CDLL(None); signal = ctypes.c_int(-1)\n"
        "libc.prctl(2, ctypes.byref(signal), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(signal.value)"
    )
    hooked = subprocess.run(
        [sys.executable, "-c", asked], preexec_fn=parent_death_hook(), capture_output=True
    )
    plain = subprocess.run([sys.executable, "-c", asked], capture_output=True)
    assert (int(hooked.stdout), int(plain.stdout)) == (signal.SIGKILL, 0)
