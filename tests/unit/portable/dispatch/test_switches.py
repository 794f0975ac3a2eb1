"""dispatch/switches: the torch settings portable mode turns off while active, across threads
(process-wide ones wait for the last mode in any thread), and denormals kept whatever the
thread count."""

import threading

import torch

from twice.portable.dispatch import switches
from twice.portable.dispatch.mode import PortableMode
from unit.portable.bits import same_bits


def test_denormals_are_kept_under_the_mode_whatever_the_thread_count():
    """torch.set_flush_denormal flushes the calling thread's denormals alone; torch's worker
    threads keep theirs, so flushed work would depend on which thread did it. The mode computes
    with denormals (IEEE) and puts the thread's flushing back on leaving."""
    x = torch.full((400_000,), 5e-320, dtype=torch.float64)
    before = torch.get_num_threads()
    results = {}
    torch.set_flush_denormal(True)
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with PortableMode("strict"):
                results[threads] = [x * 1.5, x + x, torch.relu(x), x.sum(), torch.exp(x - 745.0)]
            assert switches.stop_flushing()  # flushing again after the mode (and off now)
            torch.set_flush_denormal(True)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)
    for one, two in zip(results[1], results[2]):
        assert same_bits(one, two)
    assert bool((results[1][0] == 5e-320 * 1.5).all())  # the denormals were kept


def test_the_process_wide_switches_wait_for_the_last_mode_in_any_thread():
    """oneDNN, cuDNN, the attention fast path and backends, opt_einsum are one setting for the
    process while a mode is per thread: a mode left in one thread leaves them pinned for another
    still inside, and the last one out restores them."""

    def settings():
        return tuple(setting.get() for setting in switches.SETTINGS)

    before = settings()
    inside, leave, seen = threading.Event(), threading.Event(), []

    def other():
        with PortableMode("strict"):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with PortableMode("strict"):
        seen.append(settings())
    seen.append(settings())  # this thread has left; the other is still inside
    leave.set()
    thread.join(10)
    assert seen == [tuple(setting.value for setting in switches.SETTINGS)] * 2
    assert settings() == before


def test_every_setting_is_pinned_inside_and_put_back_after_whatever_it_was():
    """Each setting, set either way before the mode, holds the mode's value inside and its own
    value after."""
    for flip in (False, True):
        before = [setting.get() for setting in switches.SETTINGS]
        wanted = [(not value) if flip else value for value in before]
        try:
            for setting, value in zip(switches.SETTINGS, wanted):
                setting.set(value)
            with PortableMode("strict"):
                inside = [setting.get() for setting in switches.SETTINGS]
            after = [setting.get() for setting in switches.SETTINGS]
        finally:
            for setting, value in zip(switches.SETTINGS, before):
                setting.set(value)
        assert inside == [setting.value for setting in switches.SETTINGS]
        assert after == wanted
