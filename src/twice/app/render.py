"""What the commands print: pure functions from results to text (no files, no terminal, no torch).

Each `format_*` takes a command's result and returns the text the command prints; `color` says
whether to style it for a terminal (the command line decides, honouring NO_COLOR). Golden tests
hold their output byte for byte (tests/unit/app/test_render.py).
"""

from __future__ import annotations

from typing import Any

from twice.app.terminal import style
from twice.core.divergence import FIELD_MEANING, loss_gap
from twice.store.outputs import outputs_phrase
from twice.store.traceseries import loss_fault_phrase, whole_tensors_phrase

__all__ = [
    "format_comparison",
    "format_verify",
    "format_trace_cost_note",
    "format_env",
    "format_run",
    "format_resume_check",
    "format_audit",
    "format_nan",
    "format_stats",
    "format_bisect",
    "format_locate",
    "format_checkpoint",
]

# `twice run` says what tracing cost when it is at least this share of the run and this many seconds
# (a short run's fraction of a second is not worth a line).
TRACE_COST_NOTE, TRACE_COST_NOTE_SECONDS = 0.05, 1.0
SHOWN_PER_GROUP = 12  # identity differences listed per group before "first 12 shown"


def _paint(text: str, color: bool, **how: Any) -> str:
    return style(text, color, **how)  # twice's own colours, the only ones printed (terminal.py)


def _verdict(text: str, good: bool, color: bool) -> str:
    return _paint(text, color, fg="green" if good else "red", bold=True)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def format_comparison(result, color: bool = False) -> str:
    """`twice diff`: the verdict first, then identity differences, the first divergence, step
    counts."""
    lines = [_verdict(result.verdict, result.identical, color)]
    if not result.identical:
        lines.append(f"cause: {result.explanation}")
    elif result.differences:
        lines.append(f"note: {result.explanation}")
    if result.differences:
        lines.append("\nidentity differences (A -> B):")
        totals: dict[str, int] = {}
        for diff in result.differences:
            totals[diff.group] = totals.get(diff.group, 0) + 1
        shown: dict[str, int] = {}
        for diff in result.differences:
            shown[diff.group] = shown.get(diff.group, 0) + 1
            if shown[diff.group] > SHOWN_PER_GROUP:
                continue
            if shown[diff.group] == 1:
                total = totals[diff.group]
                more = (
                    f" ({total}, first {SHOWN_PER_GROUP} shown)" if total > SHOWN_PER_GROUP else ""
                )
                lines.append(f"  {diff.group}:{more}")
            lines.append(f"    {diff.key}: {diff.a} -> {diff.b}")
    if result.divergence is not None:
        lines.extend(_divergence_lines(result.divergence))
    if result.whole is not None:
        lines.append(whole_tensors_phrase(result.whole))
    if len(result.diverged) > 1:
        each = ", ".join(f"{s} at {step} ({first})" for s, (step, first) in result.diverged.items())
        lines.append(f"each stream's first divergence: {each}")
    steps = ", ".join(f"{s}: A {a} / B {b}" for s, (a, b) in result.steps.items())
    lines.append(
        f"\nrecorded steps: {steps or 'none'}; status: A {result.statuses[0]}, B "
        f"{result.statuses[1]}"
    )
    if result.judged and any(result.outputs.values()):
        lines.append(outputs_phrase(result.outputs))
    return "\n".join(lines)


def _divergence_lines(divergence) -> list[str]:
    where = "" if divergence.stream == "main" else f", stream {divergence.stream}"
    lines = [f"\nfirst divergence: step {divergence.step}{where}, in causal order:"]
    for name in divergence.fields:
        detail = ""
        if name == "loss":
            gap = loss_gap(divergence.loss_a, divergence.loss_b)
            detail = f": {divergence.loss_a} vs {divergence.loss_b}"
            if gap.get("abs") is not None:
                ulps = f", {gap['ulps']} ulps" if gap.get("ulps") is not None else ""
                detail += f" (abs {gap['abs']:.3g}{ulps})"
        elif name == "rng" and divergence.rng_sources:
            detail = f": {', '.join(divergence.rng_sources)}"
        elif name in divergence.tensors:
            names = divergence.tensors[name]
            detail = f": {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
        lines.append(f"  {FIELD_MEANING[name]}{detail}")
    return lines


def format_verify(result, color: bool = False, loss_fault: dict | None = None) -> str:
    """`twice verify`: reproducible or not, then the comparison of the re-run with the run."""
    verdict = "reproducible" if result.identical else "NOT reproducible"
    text = _verdict(verdict, result.identical, color) + "\n" + format_comparison(result, color)
    if loss_fault:
        text += f"\nnote: the run's {loss_fault_phrase(loss_fault)}: see `twice nan`"
    return text


def format_trace_cost_note(
    context: dict,
    trace_every: int,
    threshold: float = TRACE_COST_NOTE,
    min_seconds: float = TRACE_COST_NOTE_SECONDS,
) -> str | None:
    """The line `twice run` prints when the trace hooks took `threshold` or more of the run's time
    and at least `min_seconds`; None otherwise."""
    cost = context.get("trace_cost")
    if not cost or cost["share"] < threshold or cost["hooks_s"] < min_seconds:
        return None
    every = max(trace_every, 1) * 10
    return (
        f"twice: tracing took {100 * cost['share']:.0f}% of the run's time "
        f"({cost['hooks_s']:.1f} s "
        f"in twice's hooks over {cost['wall_s']:.1f} s); --trace-every {every} would trace one "
        f"step in {every}"
    )


def format_env(hazards: list, facts: dict, color: bool = False) -> str:
    """`twice env`: the hazards, each with its fix, then the facts behind them."""
    if hazards:
        lines = [f"{_plural(len(hazards), 'determinism hazard')} here:"]
    else:
        lines = ["no determinism hazards found"]
    for hazard in hazards:
        lines.append(
            f"  {_paint(hazard.name, color, bold=True)}: {hazard.detail}\n    fix: {hazard.fix}"
        )
    torch_facts, cpu, threads = facts["torch"], facts["cpu"], facts["threads"]
    gpus = ", ".join(
        f"{g['name']} (cc {g['compute_capability']}, driver {g['driver']})" for g in facts["gpus"]
    )
    env_vars = ", ".join(f"{k}={v}" for k, v in sorted(facts["env"].items()))
    lines += [
        "\nfacts:",
        f"  python {facts['python']['version']}, torch {torch_facts['version']} "
        f"(CUDA {torch_facts['cuda'] or 'none'}, cuDNN {torch_facts['cudnn'] or 'none'}, "
        f"BLAS {torch_facts['blas'] or 'unknown'})",
        f"  cpu: {cpu['model']} ({cpu['available']} of {cpu['count']} cores available)",
        f"  threads: {threads['intra_op_threads']} intra-op, {threads['inter_op_threads']} "
        f"inter-op",
        f"  TF32: matmul {facts['tf32']['matmul']}, cuDNN {facts['tf32']['cudnn']}",
        f"  gpus: {gpus or 'none'}",
        f"  numerics env: {env_vars or 'none set'}",
    ]
    return "\n".join(lines)


def format_run(row: dict, identity: dict) -> str:
    """`twice show`: one run's summary and the identity facts a reader looks for first."""
    torch_facts = identity.get("torch", {})
    code = identity.get("code", {})
    git = code.get("git") or {}
    exit_code = f" (exit {row['exit_code']})" if row["exit_code"] is not None else ""
    took = f", took {row['duration']:.1f} s" if row.get("duration") is not None else ""
    final = f", final loss {row['final_loss']:.6g}" if row.get("final_loss") is not None else ""
    lines = [
        f"run {row['id']}: {row['status']}{exit_code}{took}",
        f"  command: {row['command']}",
        f"  seed: {row['seed']}, determinism: {identity.get('determinism', {}).get('mode')}",
        f"  steps recorded: {row['steps'] if row['steps'] is not None else 'unknown'}{final}",
    ]
    if row.get("rerun_of"):
        lines.append(f"  made by twice: {row['rerun_of']}")
    if row.get("loss_fault"):
        lines.append(f"  {loss_fault_phrase(row['loss_fault'])}: see `twice nan {row['id']}`")
    if row.get("capture_error"):
        lines.append("  step capture stopped early: see capture_error.json in the run folder")
    config = identity.get("config")
    if isinstance(config, dict) and config:
        changed = row.get("config_not_default") or []
        if changed:  # the settings a person chose first, the defaults after
            ordered = [k for k in changed if k in config] + [k for k in config if k not in changed]
            lines.append(
                f"  config ({len(changed)} of {len(config)} values not at their defaults):"
            )
        else:
            ordered = list(config)
            lines.append(f"  config ({len(config)} values):")
        shown = [k for k in changed if k in config] or ordered[:12]
        lines.append("    " + ", ".join(f"{key}={config[key]!r}" for key in shown))
        if len(ordered) > len(shown):
            rest = "at their defaults" if changed else "more"
            lines.append(f"    ... and {len(ordered) - len(shown)} {rest} (`twice show --json`)")
    if git:
        dirty = " (dirty: code.patch saved)" if git.get("dirty") else ""
        lines.append(f"  git: {git.get('commit') or 'no commit'} on {git.get('branch')}{dirty}")
        for entry in git.get("untracked_by_digest") or []:
            lines.append(
                f"    untracked, by digest: {entry['path']} "
                f"({entry['size']} bytes, xxh3 {entry['xxh3']})"
            )
    lines.append(f"  sources: {len(code.get('sources', {}))} local files digested")
    inputs = identity.get("inputs")
    if isinstance(inputs, dict):
        lines.append(f"  inputs read: {len(inputs)} files")
        for path, digest in list(inputs.items())[:SHOWN_PER_GROUP]:
            lines.append(f"    {path} ({'xxh3 ' if len(digest) == 32 else ''}{digest})")
        if len(inputs) > SHOWN_PER_GROUP:
            lines.append(f"    ... and {len(inputs) - SHOWN_PER_GROUP} more (`twice show --json`)")
    lines.append(
        f"  python {identity.get('python', {}).get('version')}, "
        f"torch {torch_facts.get('version', 'not imported')}, "
        f"{len(identity.get('packages', {}))} packages"
    )
    threads = identity.get("threads", {})
    if threads:
        lines.append(
            f"  threads: {threads.get('intra_op_threads')} intra-op, "
            f"{threads.get('inter_op_threads')} inter-op"
        )
    return "\n".join(lines)


def format_resume_check(result, color: bool = False) -> str:
    """`twice verify-resume`: the verdict, its cause, and the three runs it compared."""
    lines = [_verdict(result.verdict, result.identical, color)]
    if result.cause:
        lines.append(f"cause: {result.cause}")
    lines += [f"  {role}: {path}" for role, path in result.runs.items()]
    return "\n".join(lines)


def format_segments(check, color: bool = False) -> str:
    """`twice verify --segments`: the verdict, then each segment re-run with its own."""
    lines = [_verdict(check.verdict(), check.identical, color)]
    for segment in check.checked:
        mark = "same" if segment.identical else "DIFFERS"
        lines.append(f"  steps {segment.start}-{segment.end}: {mark}: {segment.verdict}")
    return "\n".join(lines)


def format_audit(report, steps: int) -> str:
    """`twice audit`: each op that gave different bits (once per op, module and line), then the ops
    this model runs that are nondeterministic on CUDA."""
    rows, seen = [], set()
    for finding in report.differing:
        op = finding.a
        key = (op["op"], op.get("module"), op.get("line"))
        if key not in seen:
            seen.add(key)
            rows.append(
                f"  {op['op']} in {op.get('module') or '?'} ({op['phase']}) at "
                f"{op.get('line') or '?'}, "
                f"first at step {op['step']}"
            )
    if rows:
        head = (
            f"{_plural(len(rows), 'operation')} gave different bits from identical inputs in "
            f"{steps} steps run twice:"
        )
    else:
        head = f"no operation gave different bits from identical inputs in {steps} steps run twice"
    lines = [head, *rows]
    if report.cuda_hazards:
        gate = (
            "fails this audit (--for cuda)"
            if report.target == "cuda"
            else "not observed here; --for cuda fails on them"
        )
        lines.append(
            f"{_plural(len(report.cuda_hazards), 'operation')} this model runs "
            f"{'is' if len(report.cuda_hazards) == 1 else 'are'} nondeterministic on CUDA "
            f"({gate}):"
        )
        for name, info in sorted(report.cuda_hazards.items()):
            lines.append(f"  {name}: {info['fix']}")
            for site in info["sites"]:
                lines.append(
                    f"    at {site.get('line') or '?'} in {site.get('module') or '?'} "
                    f"({site['phase']})"
                )
    return "\n".join(lines)


def format_nan(report: dict | None, events: list[dict], color: bool = False) -> str:
    """`twice nan`: the first NaN/Inf and its chain of causes, or the first non-finite step the
    cheap
    checks saw, or that there was none (with the warnings recorded)."""
    faults = [e for e in events if e["kind"] == "non_finite"]
    if report is None and not faults:
        lines = [f"no NaN or Inf recorded; {_plural(len(events), 'warning')}"]
        lines += [f"  step {event['step']}: {event['summary']}" for event in events[:20]]
        return "\n".join(lines)
    if report is None:
        first = faults[0]
        head = f"non-finite values recorded from step {first['step']}: {first['summary']}"
        return "\n".join(
            [
                _paint(head, color, fg="red", bold=True),
                "(run with `twice run --numerics` to find the operation and line)",
            ]
        )
    fault = report["fault"]
    module = f", {fault['module']}" if fault.get("module") else ""
    head = (
        f"{fault['value']} at step {fault['step']}: {fault['op']} ({fault['phase']}{module}) "
        f"at {fault.get('line') or '?'}"
    )
    lines = [_paint(head, color, fg="red", bold=True), "chain of causes, first cause first:"]
    for number, event in enumerate(report["chain"], start=1):
        where = " ".join(
            part
            for part in (
                event.get("module") and f"in {event['module']}",
                event.get("line") and f"at {event['line']}",
            )
            if part
        )
        lines.append(
            f"  {number}. step {event['step']}: {event['summary']}{' ' + where if where else ''}"
        )
        if event.get("fix"):
            lines.append(f"     fix: {event['fix']}")
    return "\n".join(lines)


_METRIC_MEANING = {
    "final_loss": " (the training loss of the last minibatch, from the trace: noisy; log a "
    "validation metric with twice.log_metric('val_loss', v) and pass --metric val_loss)",
    "best_loss": " (the lowest minibatch training loss in the trace)",
}


def format_stats(metric: str, arms: list, pairs: list) -> str:
    """`twice stats`: each arm's mean and interval, then each pair's verdict against seed noise."""
    lines = [f"metric: {metric}" + _METRIC_MEANING.get(metric, "")]
    for arm in arms:
        lines.append(
            f"  {arm.arm:<30} n={arm.n}  mean {arm.mean:.6g}  sd {arm.std:.3g}  "
            f"95% CI [{arm.ci_low:.6g}, {arm.ci_high:.6g}]"
        )
    for pair in pairs:
        p_w = "n/a" if pair.p_wilcoxon is None else f"{pair.p_wilcoxon:.3g}"
        needed = (
            ""
            if pair.seeds_needed is None
            else f"; {pair.seeds_needed} seeds resolve this difference at 80% power"
        )
        lines.append(
            f"{pair.b} vs {pair.a}: {pair.verdict}: difference {pair.mean_difference:+.6g} "
            f"(95% CI [{pair.ci_low:.6g}, {pair.ci_high:.6g}]), paired t p={pair.p_t:.3g}, "
            f"Wilcoxon p={p_w}, d_z={pair.effect_size:.3g}{needed}"
        )
    return "\n".join(lines)


def format_bisect(result) -> str:
    """`twice bisect`: the first diverging step and the recorded steps around it."""
    if result.step is None:
        return "runs do not diverge"
    low, high = result.interval
    return (
        f"first divergence at step {result.step} (between recorded steps {low} and {high}; "
        f"{result.replays} replays)"
    )


def format_locate(result) -> str:
    """`twice locate`: the finding in one sentence, then where the op logs are."""
    lines = [result.sentence]
    if result.logs:
        lines.append(f"op logs: {result.logs[0]}\n         {result.logs[1]}")
    return "\n".join(lines)


def format_checkpoint(path, index) -> str:
    """`twice checkpoint verify`: a valid checkpoint and what it holds."""
    if hasattr(index, "parts"):
        return f"checkpoint {path}: valid, {index.world_size} rank parts"
    return f"checkpoint {path}: valid ({', '.join(sorted(index.entries))})"
