"""LTTB: a long series cut to a few points for a plot, keeping its ends, its turns, the points
asked for and where it went non-finite."""

import numpy as np

from twice.core.downsample import lttb


def test_a_short_series_is_kept_whole():
    assert lttb([0, 1, 2], [5.0, 4.0, 3.0], 10).tolist() == [0, 1, 2]
    assert lttb(range(50), range(50), 2).tolist() == list(range(50))  # too few points to choose


def test_a_long_series_keeps_its_ends_and_its_spike_within_the_budget():
    x = np.arange(10_000)
    y = np.sin(x / 500.0)
    y[6_543] = 40.0
    chosen = lttb(x, y, 100)
    assert len(chosen) <= 100 and chosen[0] == 0 and chosen[-1] == 9_999
    assert 6_543 in chosen and np.all(np.diff(chosen) > 0)


def test_points_asked_for_are_kept_beside_the_budget():
    x = np.arange(1_000) * 2
    chosen = lttb(x, np.zeros(1_000), 10, keep=[502, 1_998, 7])  # 7 is no x: nothing to keep
    assert {251, 999} <= set(chosen.tolist()) and len(chosen) <= 11


def test_a_non_finite_value_shows_where_its_bucket_has_it():
    y = np.linspace(0.0, 1.0, 5_000)
    y[1_234], y[4_000] = np.nan, np.inf
    chosen = lttb(np.arange(5_000), y, 50)
    assert {1_234, 4_000} <= set(chosen.tolist())
    assert lttb(np.arange(500), np.full(500, np.nan), 20)[-1] == 499  # nothing finite at all
