"""`twice report`: one self-contained HTML page (inline SVG plots, no scripts) for runs or a
sweep."""

from __future__ import annotations

import html
import io
import json
from itertools import combinations
from pathlib import Path

from twice.app.compare import Comparison, compare_runs
from twice.core.divergence import FIELD_MEANING
from twice.core.errors import UsageError
from twice.core.records import COMPARED_FIELDS
from twice.store.layout import RunFolder
from twice.store.runs import effective_status, read_manifest

__all__ = ["build_report", "write_report"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.verdict{font-size:1.1rem;font-weight:600;padding:.6rem .8rem;border-radius:6px}
.same{background:#e6f4ea;color:#1e6b34}.differ{background:#fde7e9;color:#8a1c1c}
table{border-collapse:collapse;font-size:.85rem;width:100%} td,th{border:1px solid #ddd;padding:.25rem .4rem;text-align:left;vertical-align:top}
tr.diff td{background:#fff4ce} code{font-size:.85em} .muted{color:#777} svg{max-width:100%;height:auto}
"""


def _svg(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # the `report` extra, to keep the core install light
        raise UsageError("twice report needs matplotlib", "pip install 'twice[report]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text as text: smaller files, selectable labels
    plt.rcParams["svg.hashsalt"] = (
        "twice"  # fixed element ids: the same runs give byte-identical reports
    )
    return plt


PLOT_POINTS = 2000  # per curve: LTTB keeps the extremes, the turns and the divergence


def _losses(path: Path, keep: list[int]) -> tuple:
    """(steps, losses) of a trace, cut to PLOT_POINTS by LTTB (the steps in `keep` kept)."""
    from twice.core.downsample import lttb
    from twice.store.traceseries import loss_series

    steps, values = loss_series(path)
    chosen = lttb(steps, values, PLOT_POINTS, keep=keep)
    return steps[chosen], values[chosen]


STRIP_COLUMNS = 2000  # a column is marked when a field differs at any step it covers


def _difference_strip(base: Path, other: Path):
    """(grid [fields x columns] of 0/1, first step, last step) of where `other`'s compared
    fields differ from `base`'s over their common steps; None when they share no step."""
    import numpy as np

    from twice.store.traceseries import difference_steps

    first, last, steps, masks = difference_steps(base, other)
    if first is None:
        return None
    columns = int(min(STRIP_COLUMNS, last - first + 1))
    grid = np.zeros((len(COMPARED_FIELDS), columns))
    where = ((steps - first) * columns // (last - first + 1)).astype(np.int64)
    for i in range(len(COMPARED_FIELDS)):
        hit = (masks >> i) & 1 == 1
        grid[i, where[hit]] = 1.0
    return grid, first, last


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, '
        f'initial-scale=1"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def _runs_body(run_dirs: list[Path], comparisons: list[Comparison]) -> str:
    plt = _pyplot()
    parts = [f"<h1>twice report: {len(run_dirs)} runs</h1>"]
    for comparison in comparisons:
        css = "same" if comparison.identical else "differ"
        parts.append(
            f'<p class="verdict {css}">{html.escape(comparison.b.name)} vs '
            f"{html.escape(comparison.a.name)}: "
            f"{html.escape(comparison.verdict)}</p>"
        )
        if not comparison.identical:
            parts.append(f"<p>cause: {html.escape(comparison.explanation)}</p>")
    # Manifests side by side: every identity value that differs between any two runs, then key
    # facts.
    manifests = [read_manifest(d) for d in run_dirs]
    differing = sorted({(d.group, d.key) for c in comparisons for d in c.differences})
    parts.append(
        "<h2>Manifests (identity values that differ, "
        "highlighted)</h2><table><tr><th>group</th><th>key</th>"
        + "".join(f"<th>{html.escape(d.name)}</th>" for d in run_dirs)
        + "</tr>"
    )

    def lookup(identity: dict, key: str):
        value: object = identity
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return "<missing>"
            value = value[part]
        return value

    rows = [(g, k, True) for g, k in differing]
    for key in (
        "seed",
        "determinism.mode",
        "torch.version",
        "python.version",
        "threads.intra_op_threads",
        "code.git.commit",
    ):
        if key not in {k for _, k, _ in rows}:
            rows.append(("context", key, False))
    for group, key, diff in rows:
        cells = "".join(
            f"<td><code>{html.escape(json.dumps(lookup(m.identity, key), default=str))}</code></td>"
            for m in manifests
        )
        parts.append(
            f"<tr "
            f'class="{"diff" if diff else ""}"><td>{group}</td><td><code>{html.escape(key)}</code></td>{cells}</tr>'
        )
    statuses = "".join(f"<td>{html.escape(effective_status(m))}</td>" for m in manifests)
    parts.append(f"<tr><td>context</td><td>status</td>{statuses}</tr></table>")
    # Loss curves with the first divergence marked.
    import numpy as np

    diverged = sorted({c.divergence.step for c in comparisons if c.divergence is not None})
    figure, axes = plt.subplots(figsize=(10, 3.6))
    positive = False
    for run_dir in run_dirs:
        steps, values = _losses(RunFolder(run_dir).trace(), diverged)
        positive = positive or bool((values[np.isfinite(values)] > 0).any())
        axes.plot(steps, values, linewidth=1, label=run_dir.name[-30:])
    for step in diverged:
        axes.axvline(step, color="#c0392b", linestyle="--", linewidth=1)
        axes.annotate(
            f"first divergence: step {step}",
            (step, 0.95),
            xycoords=("data", "axes fraction"),
            color="#c0392b",
            fontsize=8,
        )
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    if positive:
        axes.set_yscale("log")
    axes.legend(fontsize=7, loc="upper right")
    parts.append("<h2>Loss</h2>" + _svg(figure))
    # Per step, which parts of the record differ from the first run.
    if len(run_dirs) >= 2:
        parts.append("<h2>What differs, step by step (vs the first run)</h2>")
        for run_dir in run_dirs[1:]:
            strip = _difference_strip(RunFolder(run_dirs[0]).trace(), RunFolder(run_dir).trace())
            if strip is None:
                continue
            grid, first, last = strip
            figure, axes = plt.subplots(figsize=(10, 1.6))
            axes.imshow(
                grid,
                aspect="auto",
                cmap="Reds",
                vmin=0,
                vmax=1,
                interpolation="nearest",
                extent=(first - 0.5, last + 0.5, len(COMPARED_FIELDS) - 0.5, -0.5),
            )
            axes.set_yticks(
                range(len(COMPARED_FIELDS)),
                [FIELD_MEANING[n].split(" (")[0] for n in COMPARED_FIELDS],
                fontsize=7,
            )
            axes.set_xlabel("step", fontsize=8)
            axes.set_title(run_dir.name, fontsize=8)
            parts.append(_svg(figure))
    # Findings recorded in the runs: op-level localisation and numerical health.
    for run_dir in run_dirs:
        for located in RunFolder(run_dir).locations():
            parts.append(
                f"<h2>Localisation "
                f"({html.escape(run_dir.name)})</h2><p>{html.escape(json.loads(located.read_text())['sentence'])}</p>"
            )
        numerics = RunFolder(run_dir).numerics_report
        if numerics.is_file():
            report = json.loads(numerics.read_text())
            items = "".join(
                f"<li>step {e['step']}: {html.escape(e['summary'])}"
                + (
                    f' <span class="muted">({html.escape(e["line"])})</span>'
                    if e.get("line")
                    else ""
                )
                + "</li>"
                for e in report["chain"]
            )
            parts.append(f"<h2>Numerical health ({html.escape(run_dir.name)})</h2><ol>{items}</ol>")
    return "".join(parts)


def _sweep_body(folder: Path) -> str:
    from twice.app.sweep import sweep_results
    from twice.core.stats import compare_pair, summarize_arm

    plt = _pyplot()
    spec, values = sweep_results(folder)
    arms = [summarize_arm(arm, per_seed) for arm, per_seed in values.items()]
    pairs = [compare_pair(a, b) for a, b in combinations(arms, 2)]
    parts = [
        f"<h1>twice report: sweep {html.escape(folder.name)}</h1>",
        f"<p>metric <code>{html.escape(spec['metric'])}</code>, {spec['seeds']} seeds per arm, "
        f"command "
        f"<code>{html.escape(' '.join(spec['command']))}</code></p>",
    ]
    figure, axes = plt.subplots(figsize=(max(4, 1.6 * len(arms)), 3.6))
    for x, arm in enumerate(arms):
        axes.scatter(
            [x] * len(arm.values), list(arm.values.values()), color="#7f8c8d", s=14, zorder=2
        )
        if arm.n > 1:
            axes.errorbar(
                [x + 0.15],
                [arm.mean],
                yerr=[[arm.mean - arm.ci_low], [arm.ci_high - arm.mean]],
                fmt="o",
                color="#2c3e50",
                capsize=4,
                zorder=3,
            )
    axes.set_xticks(range(len(arms)), [a.arm for a in arms], fontsize=8)
    axes.set_ylabel(spec["metric"])
    parts.append(
        "<h2>Each arm: the metric per seed, and the mean with its 95% CI</h2>" + _svg(figure)
    )
    parts.append(
        "<h2>Pairwise verdicts</h2><table><tr><th>comparison</th><th>verdict</th><th>difference "
        "(95% CI)</th>"
        "<th>paired t p</th><th>Wilcoxon p</th><th>d_z</th><th>seeds for 80% power</th></tr>"
    )
    for pair in pairs:
        css = "differ" if pair.verdict.startswith("effect") else "same"
        parts.append(
            f"<tr><td>{html.escape(pair.b)} vs {html.escape(pair.a)}</td><td "
            f'class="{css}">{pair.verdict}</td>'
            f"<td>{pair.mean_difference:+.4g} [{pair.ci_low:.4g}, "
            f"{pair.ci_high:.4g}]</td><td>{pair.p_t:.3g}</td>"
            f"<td>{'n/a' if pair.p_wilcoxon is None else format(pair.p_wilcoxon, '.3g')}</td>"
            f"<td>{pair.effect_size:.3g}</td><td>{pair.seeds_needed or 'n/a'}</td></tr>"
        )
    parts.append("</table>")
    return "".join(parts)


def build_report(paths: list[Path]) -> str:
    """The HTML of a report on runs (compared with the first) or on one sweep folder."""
    from twice.app.sweep import SWEEP_FILE

    paths = [Path(p) for p in paths]
    if len(paths) == 1 and (paths[0] / SWEEP_FILE).is_file():
        return _page(f"twice sweep {paths[0].name}", _sweep_body(paths[0]))
    if not paths:
        raise UsageError("nothing to report on", "give run folders or a sweep folder")
    comparisons = [compare_runs(paths[0], other) for other in paths[1:]]
    return _page("twice report", _runs_body(paths, comparisons))


def write_report(paths: list[Path], output: Path) -> Path:
    """Write one self-contained HTML page about `paths` (runs, or a sweep folder) to `output`;
    return its path."""
    from twice.core.errors import from_os_error
    from twice.store.files import check_output_path, write_bytes_atomic

    check_output_path(Path(output), "report")
    page = build_report(paths).encode("utf-8")
    try:
        write_bytes_atomic(Path(output), page)
    except OSError as exc:
        raise from_os_error(exc, f"write the report {output}") from None
    return Path(output)
