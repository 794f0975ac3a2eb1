"""Runs at interpreter start in every process of a `twice run` command (via the _boot
sitecustomize).

It reads the launcher's settings from TWICE_* variables, seeds Python's `random` at once, and seeds
NumPy and torch (and switches torch to deterministic mode, and installs step capture) the moment
they are imported, so that processes that never import torch pay nothing. Only the standard
library and the launcher contract (core/protocol.py) are imported here; the rest of twice loads
inside the torch import hook.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

from twice.core.errors import Exit
from twice.core.escaping import escape_controls
from twice.core.protocol import ChildSettings
from twice.runtime.imports import when_imported
from twice.runtime.reads import files_read, watch_reads
from twice.runtime.seedcalls import recorded, watch_numpy, watch_random, watch_torch
from twice.store.layout import RunFolder

_state: dict = {}


def _on_numpy(numpy) -> None:
    seed = _state.get("seed")
    if seed is not None:
        numpy.random.seed(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32])
    watch_numpy(numpy)  # the script's own seeding calls, under --observe too


def _on_torch(torch) -> None:
    from twice.core.errors import DeterminismError
    from twice.record import hooks
    from twice.record.recorder import Recorder
    from twice.runtime import capture, determinism

    seed, mode = _state.get("seed"), _state.get("mode", "off")
    if seed is not None:
        if mode != "off":
            try:
                report = determinism.deterministic(seed=None, mode=mode)
            except DeterminismError as exc:
                sys.stderr.write(escape_controls(f"twice: {exc.render()}\n"))
                raise SystemExit(Exit.USAGE) from None
            _state["determinism"] = report.to_json()
        torch.manual_seed(seed)
    watch_torch(torch)
    if settings_portable := _state["settings"].portable:
        from twice.portable.dispatch.mode import enable

        _state["portable"] = enable(settings_portable)
    _state["torch"] = capture.torch_facts(torch)
    _watch_process_group(torch)
    settings: ChildSettings = _state["settings"]
    if settings.trace:
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        stream = f"rank{rank}" if rank is not None and world not in (None, "1") else None
        recorder = Recorder.from_settings(_state["run_dir"], settings, stream)
        hooks.install(recorder)
        numerics_mode = settings.numerics
        if numerics_mode:
            from twice.record import numerics

            numerics.watch(mode=numerics_mode, exit_on_fault=True).start()


def _local_sources() -> list[str]:
    """Files of modules this process imported from outside the interpreter and its site-packages."""
    import sysconfig

    skip = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    skip.update(os.path.realpath(p) for p in sysconfig.get_paths().values())
    skip.add(
        os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )  # twice itself
    sources = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        real = os.path.realpath(os.path.join(_state["cwd"], path))
        if not os.path.isfile(real):
            continue
        if (
            "site-packages" in real
            or "dist-packages" in real
            or any(real.startswith(s + os.sep) for s in skip)
        ):
            continue
        sources.add(real)
    # CPython deletes __main__.__file__ after the script ran; sys.argv[0] still names it.
    main = sys.argv[0] if sys.argv else ""
    if main.endswith(".py") and os.path.isfile(os.path.join(_state["cwd"], main)):
        sources.add(os.path.realpath(os.path.join(_state["cwd"], main)))
    return sorted(sources)


def _watch_process_group(torch) -> None:
    """Remember the backend and world size when the program sets up torch.distributed (gone by
    exit)."""
    dist = torch.distributed
    if not dist.is_available():
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        _state["process_group"] = {
            "backend": str(dist.get_backend()),
            "world_size": dist.get_world_size(),
            "rank": dist.get_rank(),
        }
        return result

    dist.init_process_group = init_process_group


def _distributed_facts() -> dict | None:
    rank = os.environ.get("RANK")
    if rank is None and "process_group" not in _state:
        return None
    facts = {
        "rank": int(rank) if rank is not None else None,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "nodes": os.environ.get("GROUP_WORLD_SIZE"),
    }
    if "process_group" in _state:
        facts.update(_state["process_group"])
    return facts


def _at_exit() -> None:
    if os.getpid() != _state.get("pid"):
        return  # a forked child inherited this handler
    from twice.record import hooks
    from twice.store.files import write_json_atomic

    recorder = hooks.active_recorder()
    if recorder is not None:
        recorder.finish()
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": list(sys.argv),
        "started": _state["started"],
        "ended": time.time(),
        "sources": _local_sources(),
        "seed": _state.get("seed"),
        "determinism": _state.get("determinism"),
        "torch": _state.get("torch"),
        "steps": recorder.step_index if recorder is not None else None,
        "trace_cost_s": round(recorder.cost, 6) if recorder is not None else None,
        "stopped_after": recorder.stop_after if recorder is not None and recorder.stopped else None,
        "events": recorder.events() if recorder is not None else None,
        "distributed": _distributed_facts(),
        "portable": _portable_facts(),
        "reads": files_read(),
        "seeding": recorded(),
    }
    if record["distributed"] is not None and recorder is not None and recorder.layouts.sharding:
        record["distributed"]["sharding"] = recorder.layouts.sharding
    torch = sys.modules.get("torch")
    if torch is not None:
        from twice.runtime.capture import torch_runtime_facts

        record["torch_runtime"] = torch_runtime_facts(torch)
    folder = RunFolder(_state["run_dir"])
    os.makedirs(folder.procs, exist_ok=True)
    write_json_atomic(folder.proc_record(os.getpid()), record)


def _portable_facts() -> dict | None:
    mode = _state.get("portable")
    if mode is None:
        return None
    return {
        "policy": mode.policy,
        "uncovered": list(mode.uncovered.values()),
        "compiled_eagerly": mode.compiled,
    }


def _count_fork() -> None:
    _state["forks"] = _state.get("forks", 0) + 1


def _reseed_forked_child() -> None:
    import random

    from twice.core.seeds import derive_seed

    index = _state.get("forks", 0)
    _state["forks"] = 0
    _state["fork_path"] = _state.get("fork_path", ()) + (index,)
    random.seed(derive_seed(_state["seed"], "fork", *_state["fork_path"]))


def boot() -> None:
    """Apply the launcher's settings to this process; a no-op outside `twice run`."""
    settings = ChildSettings.from_env(os.environ)
    if not settings.run_dir or _state:
        return
    _state.update(
        run_dir=settings.run_dir,
        pid=os.getpid(),
        started=time.time(),
        cwd=os.getcwd(),
        settings=settings,
    )
    # Killed with the process that started it (a torchrun agent, the script that spawned it),
    # as the launcher's own child is: no process of the run outlives the launcher.
    from twice.runtime.orphans import die_with_parent

    die_with_parent(os.getppid())
    watch_reads(str(settings.run_dir))
    if not settings.observe:
        seed = settings.seed if settings.seed is not None else 0
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE", "1")
        if rank is not None and world != "1":
            # torchrun workers: each rank its own documented seed, derive_seed(seed, "rank", r).
            from twice.core.seeds import derive_seed

            seed = derive_seed(seed, "rank", int(rank))
        _state.update(seed=seed, mode=settings.determinism or "strict")
        import random

        random.seed(seed)
        # CPython reseeds `random` from os.urandom in every forked child (random.py registers
        # an at-fork hook), so fork-based workers (multiprocessing, Hogwild) would draw
        # different numbers on every run. Ours runs after it and reseeds by fork order instead.
        os.register_at_fork(before=_count_fork, after_in_child=_reseed_forked_child)
    watch_random()
    when_imported("numpy", _on_numpy)
    when_imported("torch", _on_torch)
    atexit.register(_at_exit)
