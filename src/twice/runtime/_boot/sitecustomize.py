# twice's bootstrap: `twice run` puts this folder first on PYTHONPATH so that every Python process
# of the command (scripts, `python -m`, shell wrappers, subprocesses, torchrun workers) is seeded,
# made deterministic and recorded before the first line of user code. It then runs the
# sitecustomize this one shadows, if there is one.


def _twice_boot():
    import importlib
    import os
    import sys

    boot_dir = os.path.dirname(os.path.abspath(__file__))
    try:
        from twice.runtime import bootstrap
    except ImportError:
        # The command's interpreter may lack twice (another venv): use the launcher's copy.
        # (twice/runtime/_boot: three folders up is the one holding the twice package)
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(boot_dir))))
        try:
            from twice.runtime import bootstrap
        except ImportError as exc:
            sys.stderr.write(
                f"twice: warning: this process is not recorded: cannot import twice ({exc})\n"
            )
            bootstrap = None
    if bootstrap is not None:
        import importlib.util

        missing = [
            name
            for name in ("xxhash", "numpy", "safetensors")
            if importlib.util.find_spec(name) is None
        ]
        if missing:
            sys.stderr.write(
                f"twice: warning: this process is not recorded: its Python ({sys.executable}) "
                f"lacks {', '.join(missing)}; install twice into it\n"
            )
        else:
            bootstrap.boot()

    ours = sys.modules.pop("sitecustomize", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != boot_dir]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved_path


_twice_boot()
del _twice_boot
