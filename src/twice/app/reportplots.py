"""The report's plots: one panel per recorded metric (loss, learning rate, gradient norm, every
`twice.log_metric` series), each with the divergence marked and a scale that keeps healthy runs
readable beside a run that blew up; and the sweep's paired-seed plot. Inline SVG, deterministic."""

from __future__ import annotations

import io
import os
from pathlib import Path

from twice.core.errors import UsageError
from twice.core.escaping import escape_controls

__all__ = ["pyplot", "svg", "plot_text", "metric_panels", "paired_seeds_plot", "PLOT_POINTS"]

PLOT_POINTS = 2000  # per curve: LTTB keeps the extremes, the turns and the divergence
DIVERGENCE = "#c0392b"


def pyplot():
    """matplotlib's pyplot, set up for byte-identical SVG; a clear error without the extra."""
    try:
        import matplotlib
    except ImportError as exc:  # the `report` extra, to keep the core install light
        raise UsageError("twice report needs matplotlib", "pip install 'twice[report]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text as text: smaller files, selectable labels
    plt.rcParams["svg.hashsalt"] = "twice"  # fixed element ids: the same runs, the same bytes
    # Names come from records (runs, metrics, arms): a `$` must not start mathtext, which styles
    # the text or crashes on an unknown command (`m$\undefinedcmd$`), nor LaTeX run on them.
    plt.rcParams["text.usetex"] = False
    plt.rcParams["text.parse_math"] = False
    return plt


def plot_text(name: str) -> str:
    """A name from a record as a plot shows it: control characters escaped (a font has no glyph
    for them, and matplotlib's warning would print them raw); `$` is plain text (see pyplot)."""
    return escape_controls(str(name))


def svg(figure) -> str:
    """The figure as an inline <svg> element (no date, no XML prologue)."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _series(run_dir: Path, diverged: list[int], steps_hint: int | None) -> dict[str, tuple]:
    """{metric: (steps, values)} of one run: the trace's loss (cut by LTTB), learning rate and
    gradient norm (every k-th record), and each logged metric."""
    import numpy as np

    from twice.core.downsample import lttb
    from twice.store.layout import RunFolder
    from twice.store.metrics import read_logged
    from twice.store.reader import present
    from twice.store.traceseries import trace_series

    trace = RunFolder(run_dir).trace()
    out: dict[str, tuple] = {}
    if present(trace):
        series = trace_series(trace)  # one pass for every plotted series
        steps, values = series["loss"]
        chosen = lttb(steps, values, PLOT_POINTS, keep=diverged)
        out["loss"] = (steps[chosen], values[chosen])
        every = max(1, (steps_hint or 0) // PLOT_POINTS)
        for name in ("lr", "grad_norm"):
            steps, values = series[name]
            out["learning rate" if name == "lr" else "gradient norm"] = (
                steps[::every],
                values[::every],
            )
    logged: dict[str, tuple[list, list]] = {}
    for index, metric in enumerate(read_logged(run_dir)):
        steps_, values_ = logged.setdefault(metric.name, ([], []))
        steps_.append(index if metric.step is None else metric.step)
        values_.append(metric.value)
    for name, (steps_, values_) in sorted(logged.items()):
        out[name] = (np.asarray(steps_, dtype=np.int64), np.asarray(values_, dtype=np.float64))
    return {name: series for name, series in out.items() if len(series[0])}


def _limits(curves: list[tuple], healthy: list[bool]):
    """(low, high, log scale) for a panel: from the finite values of the healthy runs (all runs
    when none is), so that one run's blow-up does not flatten the others."""
    import numpy as np

    chosen = [c for c, ok in zip(curves, healthy) if ok] or curves
    values = np.concatenate([v[np.isfinite(v)] for _, v in chosen]) if chosen else np.zeros(0)
    if not len(values):
        return None
    low, high = float(values.min()), float(values.max())
    log = low > 0 and high / low > 100
    if log:
        return low / 1.5, high * 1.5, True
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
    return low - pad, high + pad, False


def metric_panels(
    run_dirs: list[Path], labels: list[str], diverged: list[int], faulty: list[bool], steps: list
) -> list[tuple[str, str]]:
    """(metric name, <svg>) per metric any run recorded, loss first."""
    import numpy as np

    plt = pyplot()
    labels = [plot_text(label) for label in labels]
    # Each run's series side by side: the compiled pass lets go of the interpreter while it reads.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(run_dirs), os.cpu_count() or 1))) as pool:
        per_run = list(pool.map(lambda d, n: _series(d, diverged, n), run_dirs, steps))
    names = ["loss", "learning rate", "gradient norm"]
    names = [n for n in names if any(n in s for s in per_run)] + sorted(
        {n for s in per_run for n in s} - set(names)
    )
    panels = []
    for name in names:
        curves = [s.get(name, (np.zeros(0), np.zeros(0))) for s in per_run]
        limits = _limits(curves, [not f for f in faulty])
        leaving = [_leaves(y, limits) for _, y in curves]
        cut = [label for label, where in zip(labels, leaving) if where is not None]
        if cut:  # the healthy range on the left, every run's whole range on the right
            figure, (axes, whole) = plt.subplots(
                1, 2, figsize=(12, 2.8), gridspec_kw={"width_ratios": [3, 1]}
            )
        else:
            figure, axes = plt.subplots(figsize=(10, 2.8))
            whole = None
        for label, (x, y), where in zip(labels, curves, leaving):
            if not len(x):
                continue
            (line,) = axes.plot(x, y, linewidth=1, label=label)
            if where is not None:  # where it leaves the axis: a mark on the edge
                axes.plot(
                    [x[where]], [limits[1]], marker="^", color=line.get_color(), clip_on=False
                )
            if whole is not None:
                finite = np.isfinite(y)
                whole.plot(x[finite], y[finite], linewidth=1, color=line.get_color())
        if limits is not None:
            axes.set_ylim(limits[0], limits[1])
            if limits[2]:
                axes.set_yscale("log")
        for panel in (axes, whole):
            if panel is None:
                continue
            for step in diverged:
                panel.axvline(step, color=DIVERGENCE, linestyle="--", linewidth=1)
            panel.set_xlabel("step")
        for step in diverged:
            axes.annotate(
                f"first divergence: step {step}",
                (step, 0.92),
                xycoords=("data", "axes fraction"),
                color=DIVERGENCE,
                fontsize=8,
            )
        axes.set_ylabel(plot_text(name))
        axes.legend(fontsize=7, loc="best")
        if whole is not None:
            finite = np.concatenate([y[np.isfinite(y)] for _, y in curves])
            if len(finite) and finite.min() > 0:
                whole.set_yscale("log")
            else:
                whole.set_yscale("symlog", linthresh=max(abs(limits[1]), 1e-12))
            whole.set_title("every run, its whole range", fontsize=8)
            axes.set_title(
                f"the healthy runs' range; cut at the axis (▲ where it leaves): {', '.join(cut)}",
                fontsize=8,
                color=DIVERGENCE,
            )
        panels.append((name, svg(figure)))
    return panels


def _leaves(values, limits) -> int | None:
    """The index where a curve first leaves the panel's range or turns non-finite, or None."""
    import numpy as np

    if limits is None or not len(values):
        return None
    out = ~np.isfinite(values)
    with np.errstate(invalid="ignore"):
        out |= (values < limits[0]) | (values > limits[1])
    return int(np.argmax(out)) if out.any() else None


def paired_seeds_plot(arms: list, metric: str) -> str:
    """Each arm's metric per seed, the same seed joined across arms by a line (a paired design's
    differences are the slopes), with each arm's mean and 95% CI."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(max(4, 1.8 * len(arms)), 3.6))
    seeds = sorted({seed for arm in arms for seed in arm.values})
    for seed in seeds:
        points = [(x, arm.values[seed]) for x, arm in enumerate(arms) if seed in arm.values]
        axes.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            color="#95a5a6",
            linewidth=0.8,
            marker="o",
            markersize=3,
            zorder=2,
        )
    for x, arm in enumerate(arms):
        if arm.n > 1:
            axes.errorbar(
                [x + 0.12],
                [arm.mean],
                yerr=[[arm.mean - arm.ci_low], [arm.ci_high - arm.mean]],
                fmt="o",
                color="#2c3e50",
                capsize=4,
                zorder=3,
            )
    axes.set_xticks(range(len(arms)), [plot_text(a.arm) for a in arms], fontsize=8)
    axes.set_xlim(-0.4, len(arms) - 0.6)
    axes.set_ylabel(plot_text(metric))
    return svg(figure)
