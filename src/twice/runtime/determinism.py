"""Deterministic mode: one table of global settings that `deterministic()` applies, reports and
restores.

Each setting says what was asked, what is now in effect, and why not when the two differ. Some
settings only work when made before something else happens (PYTHONHASHSEED before the interpreter
starts, CUBLAS_WORKSPACE_CONFIG before cuBLAS is used); those are checked, not silently set too
late.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twice.core.errors import DeterminismError
from twice.core.escaping import escape_controls
from twice.rng.seeding import capture_rng, restore_rng, seed_everything
from twice.runtime.imports import when_imported

__all__ = [
    "deterministic",
    "DeterminismReport",
    "Setting",
    "MODES",
    "CUBLAS_WORKSPACE",
    "hash_seed_in_effect",
]

MODES = ("strict", "warn", "off")
# ":4096:8" is the larger of the two configurations cuBLAS documents as deterministic.
# https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility
CUBLAS_WORKSPACE = ":4096:8"


@dataclass
class Setting:
    """One line of the report: the setting, what was asked, what is in effect, and why not."""

    name: str
    asked: Any
    in_effect: Any
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether the setting took effect as asked."""
        return self.asked is None or self.asked == self.in_effect


@dataclass
class DeterminismReport:
    """What `deterministic()` did. Also a context manager that undoes it (settings and RNG
    states)."""

    mode: str
    seed: int | None
    portable: bool = False
    settings: list[Setting] = field(default_factory=list)
    seeded: dict[str, int] = field(default_factory=dict)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _rng: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def problems(self) -> list[Setting]:
        """The settings that could not take effect, each with why."""
        return [s for s in self.settings if not s.ok]

    def to_json(self) -> dict:
        """As plain JSON values, for the manifest."""
        return {
            "mode": self.mode,
            "seed": self.seed,
            "portable": self.portable,
            "seeded": dict(self.seeded),
            "settings": {
                s.name: {"asked": s.asked, "in_effect": s.in_effect, "reason": s.reason}
                for s in self.settings
            },
        }

    def restore(self) -> None:
        """Put back every global setting and RNG state as it was before `deterministic()`."""
        try:
            for undo in reversed(self._undo):
                undo()
        finally:
            if self._rng is not None:
                restore_rng(self._rng)
            self._undo.clear()

    def __enter__(self) -> DeterminismReport:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


_hash_seed_checked: dict[str, bool] = {}


def hash_seed_in_effect() -> str | None:
    """The PYTHONHASHSEED this interpreter really started with, or None when hashing is randomised.

    The variable only works when set before the interpreter starts; setting it in os.environ later
    changes nothing. We check by hashing a probe string in a child started with that value.
    """
    value = os.environ.get("PYTHONHASHSEED")
    if value is None or value == "random":
        return None
    if value == "0":
        return "0" if sys.flags.hash_randomization == 0 else None
    if value not in _hash_seed_checked:
        probe = "twice-hash-probe"
        try:
            out = subprocess.run(
                [sys.executable, "-S", "-c", f"print(hash({probe!r}))"],
                env={"PYTHONHASHSEED": value, "PATH": os.environ.get("PATH", "")},
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
            _hash_seed_checked[value] = out == str(hash(probe))
        except (OSError, subprocess.SubprocessError):
            _hash_seed_checked[value] = False
    return value if _hash_seed_checked[value] else None


def _torch():
    return sys.modules.get("torch")


_inductor_hook_pending: list[bool] = []


def _set_deterministic_algorithms(torch, enabled: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms, without importing torch._inductor (1.3 s) just to set its
    flag.

    The public function imports the inductor config to copy the flag there; we set it there when
    the program itself imports it (torch.compile), so the program starts as fast as without twice.
    """
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        return
    setter(enabled, warn_only=warn_only)
    if _inductor_hook_pending:
        return
    _inductor_hook_pending.append(True)
    when_imported(
        "torch._inductor.config",
        lambda config: setattr(
            config, "deterministic", torch.are_deterministic_algorithms_enabled()
        ),
    )


def _flag_setting(
    name: str,
    get: Callable[[], Any],
    put: Callable[[Any], None],
    want: Any,
    report: DeterminismReport,
) -> None:
    before = get()
    report._undo.append(lambda: put(before))
    put(want)
    report.settings.append(Setting(name, want, get()))


def _apply_torch(report: DeterminismReport, strict: bool) -> None:
    torch = _torch()
    if torch is None:
        report.settings.append(
            Setting(
                "torch",
                "imported",
                "not imported",
                "torch is not imported; call deterministic() after importing it",
            )
        )
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul

    def get_algorithms():
        if not torch.are_deterministic_algorithms_enabled():
            return "off"
        return "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "strict"

    def put_algorithms(value):
        _set_deterministic_algorithms(torch, value != "off", value == "warn")

    _flag_setting(
        "deterministic_algorithms",
        get_algorithms,
        put_algorithms,
        "strict" if strict else "warn",
        report,
    )
    _flag_setting(
        "cudnn.deterministic",
        lambda: cudnn.deterministic,
        lambda v: setattr(cudnn, "deterministic", v),
        True,
        report,
    )
    # benchmark mode picks the fastest kernel by timing, which can differ between runs.
    _flag_setting(
        "cudnn.benchmark",
        lambda: cudnn.benchmark,
        lambda v: setattr(cudnn, "benchmark", v),
        False,
        report,
    )
    # TF32 rounds float32 inputs to 10-bit mantissas on Ampere and later: results then differ by
    # device.
    _flag_setting(
        "cuda.matmul.allow_tf32",
        lambda: matmul.allow_tf32,
        lambda v: setattr(matmul, "allow_tf32", v),
        False,
        report,
    )
    _flag_setting(
        "cudnn.allow_tf32",
        lambda: cudnn.allow_tf32,
        lambda v: setattr(cudnn, "allow_tf32", v),
        False,
        report,
    )
    _flag_setting(
        "float32_matmul_precision",
        torch.get_float32_matmul_precision,
        torch.set_float32_matmul_precision,
        "highest",
        report,
    )
    det = getattr(torch.utils, "deterministic", None)
    if det is not None and hasattr(det, "fill_uninitialized_memory"):
        _flag_setting(
            "fill_uninitialized_memory",
            lambda: det.fill_uninitialized_memory,
            lambda v: setattr(det, "fill_uninitialized_memory", v),
            True,
            report,
        )


def _apply_cublas(report: DeterminismReport, strict: bool) -> None:
    name = "CUBLAS_WORKSPACE_CONFIG"
    before = os.environ.get(name)
    torch = _torch()
    cuda_started = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    if before is not None:
        report.settings.append(Setting(name, before, before))
        return
    if cuda_started:
        setting = Setting(
            name,
            CUBLAS_WORKSPACE,
            None,
            "CUDA was initialised before CUBLAS_WORKSPACE_CONFIG was set; cuBLAS may already use "
            "a nondeterministic workspace",
        )
        if strict:
            raise DeterminismError(
                f"{setting.reason}",
                "start the program with `twice run`, or set CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                "before the first CUDA call",
            )
        report.settings.append(setting)
        return

    def undo():
        if os.environ.get(name) == CUBLAS_WORKSPACE:
            del os.environ[name]

    os.environ[name] = CUBLAS_WORKSPACE
    report._undo.append(undo)
    report.settings.append(Setting(name, CUBLAS_WORKSPACE, CUBLAS_WORKSPACE))


def _check_hash_seed(report: DeterminismReport, strict: bool) -> None:
    in_effect = hash_seed_in_effect()
    if in_effect is not None:
        report.settings.append(Setting("PYTHONHASHSEED", in_effect, in_effect))
        return
    reason = (
        "PYTHONHASHSEED was not fixed when the interpreter started; set and dict-of-str "
        "iteration order varies between runs"
    )
    if strict:
        raise DeterminismError(
            reason,
            "start the program with `twice run`, or export PYTHONHASHSEED=0 before starting "
            'Python; or pass mode="warn"',
        )
    report.settings.append(Setting("PYTHONHASHSEED", "fixed", None, reason))


def deterministic(
    seed: int | None = None, mode: str = "strict", portable: bool = False
) -> DeterminismReport:
    """Seed every RNG (when `seed` is given) and switch torch to deterministic algorithms.

    `portable=True` also routes every operation whose bits depend on the machine (thread count,
    instruction set, BLAS) through twice's portable kernels (docs/portable.md): uncovered ops
    raise under "strict" and warn under "warn".

    `mode="strict"` refuses (DeterminismError) a setting that can no longer take effect and makes
    torch raise on nondeterministic operations; `mode="warn"` warns instead of refusing and makes
    torch warn; `mode="off"` changes nothing and reports the current state. The returned report is
    also a context manager that restores every previous setting and RNG state on exit:

    >>> import torch, twice
    >>> with twice.deterministic(seed=0, mode="warn") as report:
    ...     a = torch.rand(2)
    >>> torch.are_deterministic_algorithms_enabled()
    False
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    report = DeterminismReport(mode=mode, seed=seed, portable=portable)
    if portable:
        from twice.portable.dispatch import mode as portable_mode

        if not portable_mode.entered():  # (this thread's own: a mode is per thread)
            portable_mode.enable("strict" if mode == "strict" else "warn")
            report._undo.append(portable_mode.disable)
    if mode == "off":
        report.settings = current_settings()
        return report
    strict = mode == "strict"
    # Refusals come first so that a refused call leaves nothing half-changed.
    _check_hash_seed(report, strict)
    try:
        _apply_cublas(report, strict)
        _apply_torch(report, strict)
        if seed is not None:
            report._rng = capture_rng()
            report.seeded = seed_everything(seed)
    except BaseException:
        report.restore()
        raise
    if not strict:
        for problem in report.problems:
            warnings.warn(
                escape_controls(f"twice: {problem.name}: {problem.reason}"),
                RuntimeWarning,
                stacklevel=2,
            )
    return report


def current_settings() -> list[Setting]:
    """The determinism-relevant settings as they are now, asking for nothing."""
    torch = _torch()
    out = [
        Setting("PYTHONHASHSEED", None, hash_seed_in_effect()),
        Setting("CUBLAS_WORKSPACE_CONFIG", None, os.environ.get("CUBLAS_WORKSPACE_CONFIG")),
    ]
    if torch is not None:
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        algorithms = "off"
        if torch.are_deterministic_algorithms_enabled():
            algorithms = (
                "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "strict"
            )
        out += [
            Setting("deterministic_algorithms", None, algorithms),
            Setting("cudnn.deterministic", None, cudnn.deterministic),
            Setting("cudnn.benchmark", None, cudnn.benchmark),
            Setting("cuda.matmul.allow_tf32", None, matmul.allow_tf32),
            Setting("cudnn.allow_tf32", None, cudnn.allow_tf32),
            Setting("float32_matmul_precision", None, torch.get_float32_matmul_precision()),
        ]
    return out
