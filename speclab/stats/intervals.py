"""Intervals that hold their level: the median's distribution-free interval (order statistics), the runs it
needs, an interval for one more unseen value, and a percentile bootstrap."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats


def bootstrap_interval(values: np.ndarray, stat: Callable[..., Any] = np.median, level: float = 0.95,
                       samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (``scipy.stats.bootstrap``, fixed seed: same data, same
    interval); NaNs are dropped. ``stat`` takes an ``axis`` argument (``np.median``, ``np.mean``): the
    resamples are computed at once."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    if len(values) == 1 or np.all(values == values[0]):  # every resample is the same: no spread to estimate
        v = float(stat(values))
        return v, v
    res = stats.bootstrap((values,), stat, n_resamples=samples, confidence_level=level, method="percentile",
                          rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def runs_needed(level: float = 0.95) -> int:
    """The fewest runs a distribution-free interval for the median can have at ``level``: with n runs the widest
    one, from the smallest to the largest, covers with probability 1 - 2 / 2**n."""
    if not 0 < level < 1:
        raise ValueError(f"level {level!r} is not allowed: need 0 < level < 1")
    return int(np.ceil(np.log2(2 / (1 - level)) - 1e-12))


def median_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median of independent runs: the order statistics
    (x_(j), x_(n+1-j)) with the largest j whose coverage, 1 - 2 * P(Binomial(n, 1/2) < j), is at least
    ``level``. It holds its level at every n for any continuous distribution (skewed, heavy-tailed), where a
    percentile bootstrap of the median covers about half the time at n = 2. NaN (no interval) below
    ``runs_needed(level)`` runs; missing values (NaN, None) are dropped."""
    x = np.asarray(values, dtype=float)
    x = np.sort(x[~np.isnan(x)])
    n = len(x)
    if n < runs_needed(level):
        return float("nan"), float("nan")
    j = np.arange(1, n // 2 + 1)
    ok = j[1 - 2 * stats.binom.cdf(j - 1, n, 0.5) >= level - 1e-12]
    k = int(ok.max())
    return float(x[k - 1]), float(x[n - k])


@dataclass(frozen=True)
class PredictionInterval:
    """Where one new value, exchangeable with the sample (an unseen prompt of the kind), falls: between the
    sample's ``j``-th smallest and ``j``-th largest values with probability ``coverage`` = (n + 1 - 2j) / (n + 1)."""

    lo: float
    hi: float
    coverage: float  # what it holds, at least the asked level where ``enough``
    n: int
    enough: bool  # False: even the whole range (j = 1) covers less than the level asked for


def prediction_interval(values: np.ndarray, level: float = 0.9) -> PredictionInterval:
    """Distribution-free interval for a *new* value from the distribution of ``values`` (not an interval for their
    mean or median): for n exchangeable continuous values and a new one, each of the n + 1 ranks is equally likely,
    so the order statistics (x_(j), x_(n+1-j)) cover it with probability (n + 1 - 2j) / (n + 1). The largest j that
    holds ``level``; where none does (fewer than ``prediction_size_needed(level)`` values) the whole range, with
    the smaller coverage it has and ``enough`` False. NaN below 2 values; missing values are dropped."""
    if not 0 < level < 1:
        raise ValueError(f"level {level!r} is not allowed: need 0 < level < 1")
    x = np.asarray(values, dtype=float)
    x = np.sort(x[~np.isnan(x)])
    n = len(x)
    if n < 2:
        return PredictionInterval(float("nan"), float("nan"), float("nan"), n, False)
    j = np.arange(1, n // 2 + 1)
    cover = (n + 1 - 2 * j) / (n + 1)
    ok = j[cover >= level - 1e-12]
    k = int(ok.max()) if len(ok) else 1
    return PredictionInterval(float(x[k - 1]), float(x[n - k]), float((n + 1 - 2 * k) / (n + 1)), n, bool(len(ok)))


def prediction_size_needed(level: float = 0.9) -> int:
    """The fewest values whose range covers a new one at ``level``: (n - 1) / (n + 1) >= level."""
    if not 0 < level < 1:
        raise ValueError(f"level {level!r} is not allowed: need 0 < level < 1")
    return int(np.ceil((1 + level) / (1 - level) - 1e-9))
