"""Seed-noise statistics for parametric studies: is an arm's effect larger than what seeds alone do?

Pure: numbers in, verdicts out (scipy for the distributions and tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from twice.core.errors import UsageError

__all__ = ["ArmSummary", "PairComparison", "summarize_arm", "compare_pair", "seeds_for_power"]

ALPHA = 0.05
POWER = 0.8


def _scipy():
    try:
        from scipy import stats
    except ImportError as exc:  # scipy is the `stats` extra, to keep the core install light
        raise UsageError("twice stats needs scipy", "pip install 'twice[stats]'") from exc
    return stats


@dataclass
class ArmSummary:
    """One arm's metric over its seeds."""

    arm: str
    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    values: dict[int, float]

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "arm": self.arm,
            "n": self.n,
            "mean": self.mean,
            "std": self.std,
            "ci95": [self.ci_low, self.ci_high],
            "values": {str(k): v for k, v in self.values.items()},
        }


@dataclass
class PairComparison:
    """Arm B minus arm A, paired by seed."""

    a: str
    b: str
    n: int
    mean_difference: float
    ci_low: float
    ci_high: float
    p_t: float
    p_wilcoxon: float | None
    effect_size: float
    verdict: str
    seeds_needed: int | None

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "a": self.a,
            "b": self.b,
            "n": self.n,
            "mean_difference": self.mean_difference,
            "ci95": [self.ci_low, self.ci_high],
            "p_paired_t": self.p_t,
            "p_wilcoxon": self.p_wilcoxon,
            "effect_size_dz": self.effect_size,
            "verdict": self.verdict,
            "seeds_needed_80_power": self.seeds_needed,
        }


def _mean_ci(values: list[float]) -> tuple[float, float, float, float]:
    stats = _scipy()
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    if n < 2:
        return mean, std, float("nan"), float("nan")
    half = stats.t.ppf(1 - ALPHA / 2, n - 1) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def summarize_arm(arm: str, values: dict[int, float]) -> ArmSummary:
    """Mean, standard deviation (n-1) and 95% t confidence interval of an arm's per-seed values."""
    ordered = [values[k] for k in sorted(values)]
    mean, std, low, high = _mean_ci(ordered)
    return ArmSummary(arm, len(ordered), mean, std, low, high, dict(values))


def seeds_for_power(
    effect_size: float, power: float = POWER, alpha: float = ALPHA, limit: int = 100_000
) -> int | None:
    """Seeds a paired t test needs to detect `effect_size` (Cohen's d_z) with `power` at level
    `alpha`."""
    stats = _scipy()
    if not math.isfinite(effect_size) or effect_size == 0:
        return None
    d = abs(effect_size)
    n = 2
    while n <= limit:
        df = n - 1
        critical = stats.t.ppf(1 - alpha / 2, df)
        noncentrality = d * math.sqrt(n)
        achieved = (
            1
            - stats.nct.cdf(critical, df, noncentrality)
            + stats.nct.cdf(-critical, df, noncentrality)
        )
        if achieved >= power:
            return n
        n = n + 1 if n < 1000 else int(n * 1.1)
    return None


def compare_pair(a: ArmSummary, b: ArmSummary) -> PairComparison:
    """Paired comparison of B against A over the seeds both have."""
    stats = _scipy()
    seeds = sorted(set(a.values) & set(b.values))
    if len(seeds) < 2:
        raise UsageError(
            f"arms {a.arm} and {b.arm} share {len(seeds)} seed(s); a paired comparison needs at "
            f"least 2",
            "run the sweep with --seeds 2 or more",
        )
    diffs = [b.values[s] - a.values[s] for s in seeds]
    mean, std, low, high = _mean_ci(diffs)
    if std == 0:
        # Every seed moved by exactly the same amount: no seed noise in the difference at all.
        p_t = 0.0 if mean != 0 else 1.0
        effect = math.copysign(math.inf, mean) if mean != 0 else 0.0
    else:
        p_t = float(
            stats.ttest_rel([b.values[s] for s in seeds], [a.values[s] for s in seeds]).pvalue
        )
        effect = mean / std
    try:
        p_w = float(stats.wilcoxon(diffs).pvalue) if any(diffs) else 1.0
    except ValueError:
        p_w = None
    exceeds = p_t < ALPHA and not (low <= 0 <= high)
    verdict = "effect exceeds seed noise" if exceeds else "within seed noise"
    needed = seeds_for_power(effect) if math.isfinite(effect) else len(seeds)
    return PairComparison(
        a.arm, b.arm, len(seeds), mean, low, high, p_t, p_w, effect, verdict, needed
    )
