"""Environment facts a run depends on: one small function per fact, gathered by a table.

The launcher gathers what it can without importing torch (fast); the facts that need torch are
gathered inside the training process itself (`torch_facts`), so they describe the torch that ran.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twice.core.errors import CorruptRecord
from twice.core.protocol import PREFIX
from twice.store import reader

__all__ = [
    "gather_identity_facts",
    "gather_context_facts",
    "torch_facts",
    "git_state",
    "NUMERIC_ENV_PREFIXES",
    "numeric_env",
]

# Environment variables that change numerics, kernels, threads or hashing.
NUMERIC_ENV_PREFIXES = (
    "CUBLAS_",
    "CUDA_",
    "CUDNN_",
    "NCCL_",
    "TORCH_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOMP_",
    "NVIDIA_TF32",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "XLA_",
    "HIP_",
    "ROCM_",
)
NUMERIC_ENV_NAMES = (
    "PYTHONHASHSEED",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TF32_OVERRIDE",
)


def numeric_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that change numerical results (thread counts, BLAS settings,
    ...)."""
    environ = os.environ if environ is None else environ
    return {
        k: v
        for k, v in environ.items()
        if (k.startswith(NUMERIC_ENV_PREFIXES) or k in NUMERIC_ENV_NAMES)
        and not k.startswith(PREFIX)  # the launcher's own protocol: no fact about the user's
    }


# Variables that differ between two shells of one user for reasons no script reads as
# configuration: not worth naming as a difference between runs.
_SESSION_ENV_PREFIXES = ("SSH_", "XDG_", "TMUX", "TERM", "WINDOW", "DISPLAY", "DBUS_", "GPG_")
_SESSION_ENV_NAMES = ("PWD", "OLDPWD", "SHLVL", "_", "STY", "COLUMNS", "LINES", "WAYLAND_DISPLAY")


def env_digests(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every other variable of the launch's environment as a short digest of its value (names
    only in the clear: values may be secrets), so that `twice diff` can name the variables two
    runs differ in when a script read its configuration there."""
    from twice.core.digests import digest_bytes

    environ = os.environ if environ is None else environ
    return {
        k: digest_bytes(v.encode("utf-8", "surrogateescape"))[:16]
        for k, v in sorted(environ.items())
        if not k.startswith((PREFIX, *_SESSION_ENV_PREFIXES)) and k not in _SESSION_ENV_NAMES
    }


def python_facts() -> dict[str, Any]:
    """The interpreter: version, implementation, executable, hash seed in effect."""
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_facts() -> dict[str, str]:
    """Every installed distribution and its version."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[_normalised(name)] = dist.version
    return dict(sorted(packages.items()))


def package_files_facts(path: list[str] | None = None) -> dict[str, str]:
    """Each distribution's installed files, as a 16-hex digest of the hashes its dist-info
    `RECORD` lists (pip writes every installed file's hash there): a package whose code changed
    without a new version (`pip install .` of an edited local package) differs here. A
    distribution without a RECORD (egg-info, some system packages) is left out. `path`: the
    folders searched, sys.path if None. About 30 ms for a hundred distributions, torch's 15,000
    files among them."""
    import xxhash

    files: dict[str, str] = {}
    for dist in importlib.metadata.distributions(**({} if path is None else {"path": path})):
        # the dist-info folder and the name it spells: parsing every METADATA costs 100 ms
        folder, name = getattr(dist, "_path", None), getattr(dist, "_normalized_name", None)
        if folder is None or not name or _normalised(name) in files:
            continue  # the same name twice on the path: the first is what `import` loads
        try:
            record = reader.read_input(Path(folder) / "RECORD")
        except (OSError, CorruptRecord):
            continue
        # Left out, as they differ between two installs of the same files: scripts outside the
        # package (`../../../bin/x`: the shebang names the interpreter), the dist-info's own
        # files (direct_url.json names the folder installed from), editable installs' path
        # hooks, and rows without a hash (bytecode compiled at install, or not).
        outside = (b"../", Path(folder).name.encode() + b"/", b"__editable__")
        rows = [
            row
            for row in record.splitlines()
            if not row.startswith(outside) and not row.endswith(b",,") and b".pth," not in row
        ]
        files[_normalised(name)] = xxhash.xxh3_64_hexdigest(b"\n".join(sorted(rows)))
    return dict(sorted(files.items()))


def os_facts() -> dict[str, Any]:
    """The operating system and the C library."""
    libc = platform.libc_ver()
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "libc": "-".join(x for x in libc if x),
    }


def cpu_facts() -> dict[str, Any]:
    """The CPU model, its flags that change numerics, and the cores available to this process."""
    model = platform.processor() or ""
    try:
        for line in reader.read_system("/proc/cpuinfo").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except (OSError, CorruptRecord):
        pass
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "count": os.cpu_count(), "available": available}


def gpu_facts() -> list[dict[str, Any]]:
    """GPUs as nvidia-smi sees them (no CUDA initialisation in this process); [] without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    fields = "name,compute_cap,driver_version,memory.total"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append(dict(zip(("name", "compute_capability", "driver", "memory"), parts)))
    return gpus


def _git(args: list[str], cwd: Path, env: dict | None = None) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.decode("utf-8", "surrogateescape") if result.returncode == 0 else None


# An untracked file larger than this, or with a NUL byte in its first 8 KB, is recorded by its
# digest instead of being copied into code.patch.
UNTRACKED_PATCH_LIMIT = 1 << 20
_BINARY_PROBE = 8192


def _untracked_by_digest(top: Path, paths: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Split untracked files into those the patch carries and those recorded by path, size and
    xxh3-64 digest (large or binary files)."""
    import xxhash

    small, recorded = [], []
    for name in paths:
        path = top / name
        try:
            size = path.stat().st_size
            with reader.open_input(path) as handle:
                head = handle.read(_BINARY_PROBE)
                if size <= UNTRACKED_PATCH_LIMIT and b"\0" not in head:
                    small.append(name)
                    continue
                hasher = xxhash.xxh3_64(head)
                for block in iter(lambda: handle.read(1 << 20), b""):
                    hasher.update(block)
        except (OSError, CorruptRecord):
            continue  # unreadable or gone: git would not capture it either
        recorded.append({"path": name, "size": size, "xxh3": hasher.hexdigest()})
    return small, recorded


def git_state(cwd: Path, exclude: list[Path] = ()) -> tuple[dict[str, Any] | None, str]:
    """(facts, patch): commit, branch and dirty flag; the patch holds uncommitted and untracked
    changes.

    Untracked files are included by diffing HEAD against a throw-away index, and the blobs that
    needs are written to a throw-away object store that borrows the repository's own as an
    alternate: neither the user's index nor their `.git/objects` is touched. Large or binary
    untracked files are listed in `untracked_by_digest` (path, size, xxh3) instead of the patch.
    """
    import tempfile

    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top is None:
        return None, ""
    top_path = Path(top.strip())
    objects = (_git(["rev-parse", "--git-path", "objects"], top_path) or "").strip()
    commit = (_git(["rev-parse", "--verify", "-q", "HEAD"], cwd) or "").strip() or None
    branch = (_git(["rev-parse", "--abbrev-ref", "HEAD"], cwd) or "").strip() or None
    pathspec = ["--", "."]
    for path in exclude:
        try:
            relative = Path(path).resolve().relative_to(top_path.resolve())
        except ValueError:
            continue
        pathspec.append(f":(exclude){relative.as_posix()}")
    untracked = (
        _git(["ls-files", "--others", "--exclude-standard", "-z", *pathspec], top_path) or ""
    ).split("\0")
    small, recorded = _untracked_by_digest(top_path, [name for name in untracked if name])
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"))
        env.pop("GIT_LITERAL_PATHSPECS", None)
        if objects:
            (Path(tmp) / "objects").mkdir()
            env["GIT_OBJECT_DIRECTORY"] = str(Path(tmp) / "objects")
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str((top_path / objects).resolve())
        if commit:
            _git(["read-tree", "HEAD"], top_path, env)
        _git(["add", "-u", *pathspec], top_path, env)
        if small:
            listing = Path(tmp) / "untracked"
            listing.write_bytes(
                b"\0".join(name.encode("utf-8", "surrogateescape") for name in small)
            )
            literal = dict(env, GIT_LITERAL_PATHSPECS="1")
            _git(
                ["add", f"--pathspec-from-file={listing}", "--pathspec-file-nul"], top_path, literal
            )
        base = commit or _git(["hash-object", "-t", "tree", "/dev/null"], top_path, env).strip()
        patch = (
            _git(
                ["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base, *pathspec],
                top_path,
                env,
            )
            or ""
        )
    facts = {"commit": commit, "branch": branch, "dirty": bool(patch or recorded)}
    return {**facts, "root": str(top_path), "untracked_by_digest": recorded}, patch


def gather_identity_facts() -> dict[str, Any]:
    """Facts that can change results and that the launcher can read without importing torch."""
    return {name: gather() for name, gather in IDENTITY_GATHERERS.items()}


IDENTITY_GATHERERS: dict[str, Callable[[], Any]] = {
    "python": python_facts,
    "packages": package_facts,
    "package_files": package_files_facts,
    "os": os_facts,
    "cpu": cpu_facts,
    "gpus": gpu_facts,
    "env": numeric_env,
}


def gather_context_facts() -> dict[str, Any]:
    """Facts about where and when a run ran (never compared): host, user, times."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return {"host": socket.gethostname(), "user": user, "cwd": os.getcwd()}


def _torch_config_value(config: str, key: str) -> str | None:
    match = re.search(rf"{re.escape(key)}\s*=?\s*([^\n,]+)", config)
    return match.group(1).strip() if match else None


def torch_facts(torch) -> dict[str, Any]:
    """The build and runtime facts of the torch in this process (called where torch was
    imported)."""
    config = torch.__config__.show()
    parallel = torch.__config__.parallel_info()
    cuda = torch.version.cuda
    facts: dict[str, Any] = {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "debug": bool(getattr(torch.version, "debug", False)),
        "cuda": cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "blas": _torch_config_value(config, "BLAS_INFO"),
        "lapack": _torch_config_value(config, "LAPACK_INFO"),
        "openmp": _torch_config_value(parallel, "ATen parallel backend:")
        or _torch_config_value(config, "USE_OPENMP"),
        "mkl": bool(torch.backends.mkl.is_available()),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "cpu_capability": _torch_config_value(config, "CPU capability usage:"),
    }
    if cuda and torch.cuda.is_available():
        try:
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):
            facts["nccl"] = None
        facts["cuda_device_count"] = torch.cuda.device_count()
    return facts


def torch_runtime_facts(torch) -> dict[str, Any]:
    """Facts that the program can change while it runs: read at exit."""
    facts = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "name": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "memory": props.total_memory,
                }
            )
        facts["cuda_devices"] = devices
    return facts
