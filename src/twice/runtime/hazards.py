"""This machine's determinism hazards: what would make two runs here (or here and elsewhere)
differ."""

from __future__ import annotations

import os
from dataclasses import dataclass

from twice.runtime.capture import (
    cpu_facts,
    gpu_facts,
    numeric_env,
    python_facts,
    torch_facts,
    torch_runtime_facts,
)
from twice.runtime.determinism import hash_seed_in_effect

__all__ = ["Hazard", "machine_hazards"]


@dataclass
class Hazard:
    """One thing that can change results, and how twice (or the user) deals with it."""

    name: str
    detail: str
    fix: str

    def to_json(self) -> dict:
        """As plain JSON values (what `twice env --json` prints)."""
        return {"name": self.name, "detail": self.detail, "fix": self.fix}


def machine_hazards() -> tuple[list[Hazard], dict]:
    """(hazards, facts) for this machine and this shell's environment. Imports torch."""
    import torch

    hazards = []
    if hash_seed_in_effect() is None:
        hazards.append(
            Hazard(
                "PYTHONHASHSEED",
                "not fixed: set and dict-of-str order changes every run",
                "`twice run` fixes it before the interpreter starts",
            )
        )
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_available():
        hazards.append(
            Hazard(
                "CUBLAS_WORKSPACE_CONFIG",
                "unset: cuBLAS may pick nondeterministic reductions",
                "`twice run` sets :4096:8 before CUDA starts",
            )
        )
    if not torch.are_deterministic_algorithms_enabled():
        hazards.append(
            Hazard(
                "deterministic algorithms",
                "off by default: nondeterministic kernels (scatter_add, index_add, "
                "conv backward on CUDA) are used silently",
                "`twice run` enables them (strict)",
            )
        )
    threads = torch.get_num_threads()
    if not any(k in os.environ for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        hazards.append(
            Hazard(
                "threads",
                f"torch uses {threads} intra-op threads, chosen from this machine's cores: "
                "CPU reductions round differently on a machine with another core count",
                "set OMP_NUM_THREADS (or torch.set_num_threads) to the same value everywhere, "
                "or use `twice run --portable` (the same bits at any thread count)",
            )
        )
    if "MKL_CBWR" not in os.environ and torch.backends.mkl.is_available():
        # Seen here: the VM's host went from AMD to Intel and a seeded script's NaN moved from step
        # 80 to 91 (91 still with ATen's kernels held to AVX2); on the Intel host alone it is 91, 92
        # or 75 as MKL_CBWR is unset, AVX2 or COMPATIBLE (tests/e2e/scripts/gradnorm.py).
        hazards.append(
            Hazard(
                "MKL_CBWR",
                "unset: torch's BLAS (Intel MKL) picks its code path by CPU model, so "
                "matrix products round differently on another CPU generation or vendor",
                "set MKL_CBWR=COMPATIBLE (or a branch every machine has, such as AVX2) everywhere, "
                "at some cost in speed; twice records it with the run. `twice run --portable` "
                "makes products independent of the BLAS",
            )
        )
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("DEFAULT", "NO AVX"):
        hazards.append(
            Hazard(
                "instruction set",
                f"torch's vectorised kernels use {capability}: exp, log, tanh, sums and "
                "fused multiply-adds round differently on a CPU with another instruction set "
                "(or under ATEN_CPU_CAPABILITY)",
                "`twice run --portable` computes them with twice's own kernels, the same bits on "
                "any CPU",
            )
        )
    if torch.cuda.is_available():
        if torch.backends.cudnn.allow_tf32:
            hazards.append(
                Hazard(
                    "cudnn.allow_tf32",
                    "on by default: convolutions round inputs to TF32 on Ampere and later",
                    "`twice run` turns it off",
                )
            )
        if torch.backends.cudnn.benchmark:
            hazards.append(
                Hazard(
                    "cudnn.benchmark",
                    "on: the convolution algorithm is chosen by timing",
                    "`twice run` turns it off",
                )
            )
    facts = {
        "python": python_facts(),
        "cpu": cpu_facts(),
        "gpus": gpu_facts(),
        "torch": torch_facts(torch),
        "threads": torch_runtime_facts(torch),
        "env": numeric_env(),
        "tf32": {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
        },
    }
    return hazards, facts
