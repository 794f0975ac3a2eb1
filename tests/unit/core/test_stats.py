"""The sweep's statistics: an arm's mean and interval, a paired comparison of two arms and its
verdict, the seeds a paired t test needs."""

import math

import numpy as np
import pytest

from twice.core.errors import UsageError
from twice.core.stats import compare_pair, seeds_for_power, summarize_arm


def test_a_known_effect_is_found_and_no_effect_is_within_seed_noise():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1.0, 10)
    base = summarize_arm("a", {s: 5.0 + noise[s] for s in range(10)})
    shifted = summarize_arm("b", {s: 5.0 + noise[s] + 0.8 + rng.normal(0, 0.2) for s in range(10)})
    same = summarize_arm("c", {s: 5.0 + noise[s] + rng.normal(0, 0.5) for s in range(10)})
    assert compare_pair(base, shifted).verdict == "effect exceeds seed noise"
    assert compare_pair(base, same).verdict == "within seed noise"
    assert seeds_for_power(0.5) == 34  # paired t test, d_z = 0.5, 80% power, alpha 0.05
    assert math.isclose(
        compare_pair(base, shifted).mean_difference,
        np.mean([shifted.values[s] - base.values[s] for s in range(10)]),
    )


def test_an_arm_shifted_by_the_same_amount_on_every_seed_is_an_effect_without_noise():
    base = summarize_arm("a", {0: 1.0, 1: 2.0, 2: 4.0})
    shifted = summarize_arm("b", {0: 1.5, 1: 2.5, 2: 4.5})
    found = compare_pair(base, shifted)
    assert (found.mean_difference, found.p_t, found.effect_size) == (0.5, 0.0, math.inf)
    assert found.verdict == "effect exceeds seed noise" and found.seeds_needed == 3
    same = compare_pair(base, base)
    assert (same.p_t, same.effect_size, same.verdict) == (1.0, 0.0, "within seed noise")


def test_an_arm_summary_is_its_mean_sample_deviation_and_t_interval():
    arm = summarize_arm("a", {3: 2.0, 1: 4.0, 2: 6.0})
    assert (arm.n, arm.mean, arm.std) == (3, 4.0, 2.0)
    half = 4.302652729911275 * 2.0 / math.sqrt(3)  # t(0.975, 2)
    assert math.isclose(arm.ci_low, 4.0 - half) and math.isclose(arm.ci_high, 4.0 + half)
    assert arm.to_json()["values"] == {"3": 2.0, "1": 4.0, "2": 6.0}
    one = summarize_arm("b", {0: 1.0})
    assert one.mean == 1.0 and math.isnan(one.std) and math.isnan(one.ci_low)


def test_arms_sharing_fewer_than_two_seeds_are_refused_with_a_fix():
    with pytest.raises(UsageError, match="share 1 seed") as raised:
        compare_pair(summarize_arm("a", {0: 1.0, 1: 2.0}), summarize_arm("b", {1: 2.0, 2: 3.0}))
    assert raised.value.hint == "run the sweep with --seeds 2 or more"
    assert seeds_for_power(0.0) is None and seeds_for_power(math.nan) is None
