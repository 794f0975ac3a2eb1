"""Largest-triangle-three-buckets: a long series cut to a few thousand points for a plot, keeping
its extremes and its turns (Steinarsson, 2013), plus any points the caller must keep (a
divergence). Pure: NumPy is imported when called."""

from __future__ import annotations

__all__ = ["lttb"]


def lttb(x, y, points: int, keep=()):
    """Indices of at most `points` (+ len(keep)) points of (x, y) chosen by LTTB, sorted; the
    first and last points and every x in `keep` are always among them. NaN and infinite values
    are chosen where their bucket has nothing else (so a run gone non-finite still shows where)."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n <= points or points < 3:
        chosen = np.arange(n)
    else:
        finite = np.isfinite(y)
        level = np.where(finite, y, np.nanmax(np.where(finite, y, np.nan)) if finite.any() else 0)
        edges = np.linspace(1, n - 1, points - 1).astype(np.int64)
        chosen = [0]
        for bucket in range(points - 2):
            start, stop = edges[bucket], max(edges[bucket + 1], edges[bucket] + 1)
            following = slice(stop, max(edges[min(bucket + 2, points - 2)], stop + 1))
            mean_x, mean_y = x[following].mean(), level[following].mean()
            a = chosen[-1]
            area = np.abs(
                (x[a] - mean_x) * (level[start:stop] - level[a])
                - (x[a] - x[start:stop]) * (mean_y - level[a])
            )
            if not finite[start:stop].all():
                area = np.where(finite[start:stop], area, np.inf)  # a non-finite value shows
            chosen.append(start + int(np.argmax(area)))
        chosen.append(n - 1)
        chosen = np.asarray(chosen)
    if len(keep):
        chosen = np.union1d(chosen, np.nonzero(np.isin(x, np.asarray(keep, dtype=np.float64)))[0])
    return np.unique(chosen)
