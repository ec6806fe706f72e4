"""Intervals over seeds that hold their level at a handful of seeds, and the power analysis that sets the
seed count of a registered study (docs/STUDIES.md).

A study's unit of replication is the training seed: one number per seed (a paired item-level change
averaged over the items, or the difference of two models' changes at the same seed), combined as their
mean with a Student t interval on n - 1 degrees of freedom. With 3-5 seeds a percentile bootstrap over
seeds is anti-conservative (its one-sided 5 % bound is crossed in 6.5-8 % of null simulations: the
bootstrap distribution of a mean of n values is narrower than the mean's sampling distribution by
sqrt((n - 1) / n) and has no t tail); the t interval is exact for normal seed values and close for the
skewed ones these studies produce (tests/unit/studies/test_stats.py shows both by simulation).

Student's t distribution is computed here from its closed form for integer degrees of freedom
(Abramowitz & Stegun 26.7.3-4), so the studies need nothing beyond numpy.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

LEVEL = 0.95  # two-sided intervals; the one-sided bounds are at 95 % too (the 90 % interval's ends)


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with integer ``df`` >= 1 degrees of freedom (closed form)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df={df}: expected an integer >= 1")
    theta = math.atan(abs(x) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 1:  # A(t|nu) = 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), nu > 1
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2.0 / math.pi * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
    else:  # A(t|nu) = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + 0.5 * a if x >= 0 else 0.5 - 0.5 * a


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}: expected 0 < p < 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def t_interval(values: Sequence[float], level: float = LEVEL) -> dict:
    """Mean of the per-seed ``values`` with its t interval: ``lo``/``hi`` two-sided at ``level``,
    ``lower``/``upper`` the one-sided bounds at ``level`` (the ends of the 2 * level - 1 interval), ``se``,
    ``n``, ``t`` (mean / se) and ``sd``. Needs at least 2 values."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        raise ValueError(f"t_interval: {n} value(s); expected at least 2 seeds")
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    two, one = t_quantile(0.5 + level / 2.0, n - 1), t_quantile(level, n - 1)
    return {"mean": mean, "sd": sd, "se": se, "n": n, "t": mean / se if se > 0 else math.copysign(math.inf, mean),
            "lo": mean - two * se, "hi": mean + two * se, "lower": mean - one * se, "upper": mean + one * se}


def power(n: int, sd: float, effect: float, alpha: float = 1.0 - LEVEL, draws: int = 200_000,
          seed: int = 0) -> float:
    """Probability that the one-sided t test at ``alpha`` over ``n`` seeds (values ~ Normal(effect, sd))
    rejects 'no effect': P(mean - t_{1-alpha, n-1} se > 0). Monte Carlo over the non-central t (exact in
    distribution; ``draws`` fixes its precision to about +-0.002)."""
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(draws) + effect / sd * math.sqrt(n)
    chi = np.sqrt(rng.chisquare(n - 1, draws) / (n - 1))
    return float(np.mean(z / chi > t_quantile(1.0 - alpha, n - 1)))


def seeds_for_power(sd: float, effect: float, target: float = 0.8, alpha: float = 1.0 - LEVEL,
                    n_min: int = 3, n_max: int = 64) -> int:
    """The fewest seeds (>= ``n_min``) whose one-sided t test at ``alpha`` detects a true mean ``effect``
    with probability ``target`` when seed values have standard deviation ``sd``; ``n_max`` when none up to
    it does. By symmetry it is also the count at which a true mean of 0 leaves the one-sided bound below
    ``effect`` with that probability (the 'not supported' side of a registered decision rule)."""
    for n in range(max(2, n_min), n_max + 1):
        if power(n, sd, effect, alpha) >= target:
            return n
    return n_max


def percentile_bootstrap(values: Sequence[float], reps: int, rng: np.random.Generator,
                         level: float = LEVEL) -> dict:
    """The seeds-only percentile bootstrap of the mean (what finding1_paired used, over seeds and items):
    kept only to show, in the tests and docs, how it under-covers at a handful of seeds."""
    x = np.asarray(values, dtype=float)
    means = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(axis=1)
    lo, lower, upper, hi = np.percentile(means, [50 * (1 - level), 100 * (1 - level), 100 * level,
                                                 100 - 50 * (1 - level)])
    return {"mean": float(x.mean()), "lo": lo, "hi": hi, "lower": lower, "upper": upper}
