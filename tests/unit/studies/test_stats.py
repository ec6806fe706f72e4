"""Intervals over seeds (megatron_loop/studies/stats.py): Student's t against tabulated quantiles, the t
interval's coverage at the registered seed counts shown by simulation (normal and skewed seed values), the
seeds-only percentile bootstrap's under-coverage at 3-5 seeds (finding1_paired's flaw), and the power
analysis."""

from __future__ import annotations

import math

import numpy as np
import pytest

from megatron_loop.studies import PLANS
from megatron_loop.studies.stats import percentile_bootstrap, power, seeds_for_power, t_cdf, t_interval, t_quantile


@pytest.mark.parametrize("p, df, table", [  # Student t tables (e.g. Abramowitz & Stegun Table 26.10)
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.95, 4, 2.132), (0.975, 7, 2.365),
    (0.95, 7, 1.895), (0.975, 19, 2.093), (0.95, 19, 1.729), (0.975, 30, 2.042), (0.95, 120, 1.658)])
def test_t_quantiles_match_the_tables(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=6e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)
    assert t_quantile(1 - p, df) == -t_quantile(p, df)


def test_t_cdf_is_a_distribution():
    for df in (1, 2, 3, 10):
        xs = np.linspace(-8, 8, 33)
        cdf = [t_cdf(x, df) for x in xs]
        assert all(b > a for a, b in zip(cdf, cdf[1:])) and t_cdf(0.0, df) == 0.5
        assert t_cdf(-1.3, df) == pytest.approx(1 - t_cdf(1.3, df), abs=1e-15)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi


def _coverage(sample, n: int, reps: int, rng: np.random.Generator, truth: float) -> tuple[float, float]:
    """(two-sided 95 % coverage, rate at which the one-sided 95 % lower bound exceeds the truth)."""
    cover = above = 0
    for _ in range(reps):
        s = t_interval(sample(rng, n))
        cover += s["lo"] <= truth <= s["hi"]
        above += s["lower"] > truth
    return cover / reps, above / reps


def _skewed(rng, n):
    # per-seed values with a moderate right skew (gamma, shape 8: skewness 0.71) and mean 0; a per-seed value is
    # a mean over hundreds of items, so its skew comes from the seeds alone. Stronger skew (shape 2, skewness
    # 1.4) costs the t interval 2-3 points of coverage at 8 seeds and up to 12 % one-sided error on the short
    # tail's side (docs/STUDIES.md says so); bootstrap-t does not fix that at 8 seeds either (7-9 %).
    return rng.gamma(8.0, 1.0, size=n) - 8.0


def test_t_interval_holds_its_level_at_the_registered_seed_counts():
    """3,000 simulated studies per registered seed count: with normal seed values the two-sided coverage and
    both one-sided error rates are within Monte Carlo error (4 standard errors) of 95 % and 5 %; with
    moderately skewed seed values coverage is within 2 points and each one-sided error at most 9 % (about 8 %
    at 8 seeds on the short tail's side, nearer 5 % at 20: the t interval's known cost under skew)."""
    rng = np.random.default_rng(42)
    counts = sorted({len(arm.seeds) for plan in PLANS.values() for arm in plan.arms})
    se = math.sqrt(0.05 * 0.95 / 3000)  # 0.004
    for n in counts:
        cov, fp = _coverage(lambda r, k: r.normal(1.0, 3.0, size=k), n, 3000, rng, 1.0)
        assert abs(cov - 0.95) < 4 * se and abs(fp - 0.05) < 4 * se, (n, cov, fp)
        cov, fp = _coverage(lambda r, k: -r.normal(-1.0, 3.0, size=k), n, 3000, rng, 1.0)  # the upper bound's side
        assert abs(fp - 0.05) < 4 * se, (n, fp)
        cov, fp = _coverage(_skewed, n, 3000, rng, 0.0)
        assert abs(cov - 0.95) < 0.02 and fp < 0.09, (n, cov, fp)
        cov, fp = _coverage(lambda r, k: -_skewed(r, k), n, 3000, rng, 0.0)
        assert fp < 0.09, (n, fp)


def test_percentile_bootstrap_is_anti_conservative_at_a_handful_of_seeds():
    """The flaw of finding1_paired's intervals: with 3-5 seeds the seeds' percentile bootstrap's one-sided
    5 % bound is crossed far more often than 5 % under the null; the t bound is not."""
    rng = np.random.default_rng(7)
    for n in (3, 4, 5):
        boot = t = 0
        for _ in range(1500):
            x = rng.normal(0.0, 1.0, size=n)
            boot += percentile_bootstrap(x, 400, rng)["lower"] > 0
            t += t_interval(x)["lower"] > 0
        assert boot / 1500 > 0.075 and t / 1500 < 0.065, (n, boot / 1500, t / 1500)


def test_power_and_seed_counts():
    assert power(20, 1.0, 0.0) == pytest.approx(0.05, abs=0.005)  # the test's size
    assert power(10, 1.0, 1.0) > power(5, 1.0, 1.0) > power(3, 1.0, 1.0)
    # the classic normal-approximation count ((z_.95 + z_.8) sd / effect)^2 = 6.2, plus the t's cost
    assert seeds_for_power(1.0, 1.0) == 8
    assert seeds_for_power(4.2, 2.0) == 29 and seeds_for_power(4.2, 3.0) == 14  # the 16-32 / 8-15
    assert power(seeds_for_power(2.0, 1.5), 2.0, 1.5) >= 0.8 > power(seeds_for_power(2.0, 1.5) - 1, 2.0, 1.5)
