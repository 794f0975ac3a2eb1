"""Cost of a step recorded at op level (twice run --record-ops), against a plain step, in one
process.

Target (issue 5): a recorded step costs at most 5x a plain step on a small CPU model; steps that
are not recorded cost what they cost without twice. For scale, the same steps also run under
PyTorch's own per-op hashing debug mode (torch.utils._debug_mode.DebugMode with input and output
hashes and stack traces), where this torch has it.

Method: one model trained on throughout; short blocks of steps alternate between the variants in
rotating order (this VM's speed drifts by 10-30% over seconds), and the median of the per-round
ratios is reported, in CPU time (steadier than wall time here; one torch thread and no threads of
twice's, so the two agree). Naming the modules and parameters (a scan
of live objects, once per process and model) is measured apart.
"""

import contextlib
import statistics

import torch
from _common import run_folder, size, small_mlp, train_steps

from twice.record import hooks

STEPS = size("STEPS", 20, 2)
ROUNDS = size("ROUNDS", 25, 1)


def build():
    return small_mlp(STEPS)


def loop(setup, recorder=None, steps=STEPS, context=contextlib.nullcontext):
    if recorder is not None:
        hooks.install(recorder)
    try:
        with context():
            return train_steps(*setup, steps)
    finally:
        if recorder is not None:
            hooks.uninstall()


def torch_debug_mode():
    """PyTorch's per-op hashing debug mode, or None where this torch lacks it."""
    try:
        from torch.utils._debug_mode import DebugMode
    except ImportError:
        return None

    @contextlib.contextmanager
    def context():
        with (
            DebugMode(record_stack_trace=True, record_nn_module=True),
            DebugMode.log_tensor_hashes("hash_tensor", hash_inputs=True),
        ):
            yield

    return context


def main():
    torch.set_num_threads(1)
    setup = build()
    loop(setup)
    debug = torch_debug_mode()
    times = {"plain": [], "twice": [], "torch": []}
    with run_folder() as tmp:
        naming = loop(setup, hooks.Recorder(f"{tmp}/names", record_ops={0, 1}), steps=1)
        variants = ["plain", "twice"] + (["torch"] if debug else [])
        for round_ in range(ROUNDS):
            shift = round_ % len(variants)
            for kind in variants[shift:] + variants[:shift]:
                if kind == "plain":
                    times[kind].append(loop(setup))
                elif kind == "twice":
                    times[kind].append(
                        loop(
                            setup,
                            hooks.Recorder(f"{tmp}/{round_}", record_ops=set(range(STEPS + 1))),
                        )
                    )
                else:
                    times[kind].append(loop(setup, context=debug))
    p = statistics.median(times["plain"]) / STEPS
    ratio = statistics.median(t / q for t, q in zip(times["twice"], times["plain"]))
    print(
        f"small CPU MLP (0.1M params, batch 64, Adam, 1 thread), CPU time, median of {ROUNDS} "
        f"rounds of {STEPS} steps"
    )
    print(
        f"  plain step {p * 1e3:.2f} ms; op-recorded step (twice run --record-ops, with the step "
        f"trace) "
        f"{ratio:.2f}x (target <= 5x)"
    )
    if debug:
        torch_ratio = statistics.median(t / q for t, q in zip(times["torch"], times["plain"]))
        print(
            f"  PyTorch DebugMode with input and output hashes and stack traces: {torch_ratio:.2f}x"
        )
    print(f"  first recorded step, naming modules and parameters once: {naming * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
