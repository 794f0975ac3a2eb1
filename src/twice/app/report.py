"""`twice report`: one self-contained HTML page (inline SVG plots, no scripts) for runs or a
sweep."""

from __future__ import annotations

import html
import json
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations
from pathlib import Path

from twice.app.compare import Comparison, compare_runs
from twice.app.reportplots import metric_panels, paired_seeds_plot, plot_text, pyplot, svg
from twice.core.divergence import FIELD_MEANING
from twice.core.errors import UsageError
from twice.core.escaping import escape_controls
from twice.core.manifest import group_of
from twice.core.records import COMPARED_FIELDS
from twice.store.faults import read_numerics
from twice.store.findings import read_location
from twice.store.layout import RunFolder
from twice.store.runs import read_manifest

__all__ = ["build_report", "write_report"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.verdict{font-size:1.1rem;font-weight:600;padding:.6rem .8rem;border-radius:6px}
.same{background:#e6f4ea;color:#1e6b34}.differ{background:#fde7e9;color:#8a1c1c}
table{border-collapse:collapse;font-size:.85rem;width:100%} td,th{border:1px solid #ddd;padding:.25rem .4rem;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums} .fault{color:#8a1c1c;font-weight:600}
tr.diff td{background:#fff4ce} code{font-size:.85em} .muted{color:#777;font-size:.8em} svg{max-width:100%;height:auto}
"""


# The page runs nothing and loads nothing: scripts, frames, fonts and fetches are refused, should
# a record's text ever slip past html.escape; the plots are inline SVG, the style inline.
_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _page(title: str, body: str) -> str:
    """The page around `body`, whose record strings were escaped with html.escape; control
    characters (a bidirectional override reorders what a reader sees) shown as escapes."""
    title, body = escape_controls(title), escape_controls(body)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">'
        f'<meta name="viewport" content="width=device-width, '
        f'initial-scale=1"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


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


def _label(row: dict) -> str:
    """A run as people name it: its --name first, then its id."""
    short = "-".join(row["id"].split("-", 4)[:4])
    return f"{row['name']} ({short})" if row.get("name") else row["id"]


def _runs_table(rows: list[dict], manifests: list) -> str:
    """Name, status (faults marked), steps, duration, final metrics, and the config values that
    differ between the runs."""
    from twice.store.traceseries import loss_fault_phrase

    configs = [m.identity.get("config") or {} for m in manifests]
    keys = sorted({k for c in configs for k in c})
    differing = [
        k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
    ]
    logged = sorted({name for row in rows for name in row["last_logged"]})
    head = (
        "<tr><th>run</th><th>status</th><th>steps</th><th>took</th><th>final loss</th>"
        + "".join(f"<th>{html.escape(n)}</th>" for n in logged)
        + "".join(f"<th><code>{html.escape(k)}</code></th>" for k in differing)
        + "</tr>"
    )
    body = []
    for row, config in zip(rows, configs):
        status = html.escape(row["status"])
        if row.get("loss_fault"):
            status += f'<br><span class="fault">{html.escape(loss_fault_phrase(row["loss_fault"]))}</span>'
        if row.get("capture_error"):
            status += '<br><span class="fault">step capture stopped early</span>'
        took = "" if row.get("duration") is None else f"{row['duration']:.1f} s"
        loss = "" if row.get("final_loss") is None else f"{row['final_loss']:.6g}"
        name = html.escape(row.get("name") or "")
        cells = [
            f"<td>{name or html.escape(row['id'])}"
            + (f'<br><span class="muted">{html.escape(row["id"])}</span>' if name else "")
            + "</td>",
            f"<td>{status}</td>",
            f'<td class="num">{"" if row["steps"] is None else html.escape(str(row["steps"]))}</td>',
            f'<td class="num">{took}</td>',
            f'<td class="num">{loss}</td>',
        ]
        cells += [
            f'<td class="num">{row["last_logged"][n]:.6g}</td>'
            if n in row["last_logged"]
            else "<td></td>"
            for n in logged
        ]
        cells += [
            f"<td><code>{html.escape(json.dumps(config.get(k), default=str))}</code></td>"
            for k in differing
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return "<h2>Runs</h2><table>" + head + "".join(body) + "</table>"


def _manifest_table(run_dirs: list[Path], labels: list[str], manifests: list, comparisons) -> str:
    """Every identity value that differs between any two runs (highlighted), then key facts."""
    differing = sorted({(d.group, d.key) for c in comparisons for d in c.differences})
    parts = [
        "<h2>Manifests (identity values that differ, highlighted)</h2><table><tr><th>group</th>"
        "<th>key</th>" + "".join(f"<th>{html.escape(label)}</th>" for label in labels) + "</tr>"
    ]

    def lookup(identity: dict, key: str):
        # keys may hold dots themselves (inputs.data/train.bin, code.sources.model.py): at each
        # level, the longest run of the key's parts that names an entry
        value: object = identity
        parts, at = key.split("."), 0
        while at < len(parts):
            if not isinstance(value, dict):
                return "<missing>"
            for end in range(len(parts), at, -1):
                if ".".join(parts[at:end]) in value:
                    value, at = value[".".join(parts[at:end])], end
                    break
            else:
                return "<missing>"
        return value

    rows = [(g, k, True) for g, k in differing]
    for key in (
        "seed",
        "determinism.mode",
        "torch.version",
        "python.version",
        "threads.intra_op_threads",
        "code.git.commit",
        "inputs",
    ):
        if key not in {k for _, k, _ in rows}:
            rows.append((group_of(key), key, False))
    for group, key, diff in rows:
        cells = "".join(
            f"<td><code>{html.escape(json.dumps(lookup(m.identity, key), default=str))}</code></td>"
            for m in manifests
        )
        parts.append(
            f'<tr class="{"diff" if diff else ""}"><td>{html.escape(group)}</td>'
            f"<td><code>{html.escape(key)}</code></td>{cells}</tr>"
        )
    return "".join(parts) + "</table>"


def _runs_body(run_dirs: list[Path], comparisons: list[Comparison]) -> str:
    from twice.store.metrics import read_logged
    from twice.store.runs import summarize_run

    plt = pyplot()
    rows = [summarize_run(d) for d in run_dirs]
    for row, run_dir in zip(rows, run_dirs):
        row["last_logged"] = {m.name: m.value for m in read_logged(run_dir)}
    labels = [_label(row) for row in rows]
    manifests = [read_manifest(d) for d in run_dirs]
    parts = [f"<h1>twice report: {len(run_dirs)} runs</h1>"]
    for comparison in comparisons:  # the verdicts first
        css = "same" if comparison.identical else "differ"
        a, b = labels[0], labels[run_dirs.index(comparison.b)]
        parts.append(
            f'<p class="verdict {css}">{html.escape(b)} vs {html.escape(a)}: '
            f"{html.escape(comparison.verdict)}</p>"
        )
        if not comparison.identical:
            parts.append(f"<p>cause: {html.escape(comparison.explanation)}</p>")
    parts.append(_runs_table(rows, manifests))
    diverged = sorted({c.divergence.step for c in comparisons if c.divergence is not None})
    faulty = [bool(row.get("loss_fault")) for row in rows]
    # The step-by-step differences are walked (compiled, without the interpreter) while the
    # panels' series are read: two cores, two passes at once.
    with ThreadPoolExecutor(max_workers=1) as pool:
        base = RunFolder(run_dirs[0]).trace()
        strips = [pool.submit(_difference_strip, base, RunFolder(d).trace()) for d in run_dirs[1:]]
        panels = metric_panels(run_dirs, labels, diverged, faulty, [row["steps"] for row in rows])
        strips = [future.result() for future in strips]
    for name, picture in panels:
        parts.append(f"<h2>{html.escape(name[:1].upper() + name[1:])}</h2>" + picture)
    if len(run_dirs) >= 2:
        parts.append("<h2>What differs, step by step (vs the first run)</h2>")
        for strip, label in zip(strips, labels[1:]):
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
            for step in diverged:
                axes.axvline(step, color="#c0392b", linestyle="--", linewidth=1)
            axes.set_xlabel("step", fontsize=8)
            axes.set_title(plot_text(label), fontsize=8)
            parts.append(svg(figure))
    parts.append(_manifest_table(run_dirs, labels, manifests, comparisons))
    # Findings recorded in the runs: op-level localisation and numerical health.
    for run_dir, label in zip(run_dirs, labels):
        for located in RunFolder(run_dir).locations():
            parts.append(
                f"<h2>Localisation ({html.escape(label)})</h2>"
                f"<p>{html.escape(read_location(located)['sentence'])}</p>"
            )
        report = read_numerics(run_dir)[0]
        if report is not None:
            items = "".join(
                f"<li>step {html.escape(str(e['step']))}: {html.escape(str(e['summary']))}"
                + (
                    f' <span class="muted">({html.escape(str(e["line"]))})</span>'
                    if e.get("line")
                    else ""
                )
                + "</li>"
                for e in report["chain"]
            )
            parts.append(f"<h2>Numerical health ({html.escape(label)})</h2><ol>{items}</ol>")
    return "".join(parts)


def _sweep_body(folder: Path) -> str:
    from twice.app.sweep import sweep_results
    from twice.core.stats import compare_pair, summarize_arm

    spec, values = sweep_results(folder)
    arms = [summarize_arm(arm, per_seed) for arm, per_seed in values.items()]
    pairs = [compare_pair(a, b) for a, b in combinations(arms, 2)]
    parts = [f"<h1>twice report: sweep {html.escape(folder.name)}</h1>"]
    for pair in pairs:  # the verdicts first
        css = "differ" if pair.verdict.startswith("effect") else "same"
        parts.append(
            f'<p class="verdict {css}">{html.escape(pair.b)} vs {html.escape(pair.a)}: '
            f"{html.escape(pair.verdict)} (difference {pair.mean_difference:+.4g}, 95% CI "
            f"[{pair.ci_low:.4g}, {pair.ci_high:.4g}])</p>"
        )
    parts.append(
        f"<p>metric <code>{html.escape(spec['metric'])}</code>, "
        f"{html.escape(str(spec['seeds']))} seeds per arm, "
        f"command <code>{html.escape(' '.join(spec['command']))}</code></p>"
    )
    parts.append(
        "<h2>Each arm: the metric per seed (the same seed joined across arms), and the mean with "
        "its 95% CI</h2>" + paired_seeds_plot(arms, spec["metric"])
    )
    parts.append(
        "<h2>Pairwise tests</h2><table><tr><th>comparison</th><th>verdict</th><th>difference "
        "(95% CI)</th>"
        "<th>paired t p</th><th>Wilcoxon p</th><th>d_z</th><th>seeds for 80% power</th></tr>"
    )
    for pair in pairs:
        css = "differ" if pair.verdict.startswith("effect") else "same"
        parts.append(
            f"<tr><td>{html.escape(pair.b)} vs {html.escape(pair.a)}</td><td "
            f'class="{css}">{html.escape(pair.verdict)}</td>'
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
