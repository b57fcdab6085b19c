"""Goodness-of-fit of sampled counts against a known distribution."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    pvalue: float
    dof: int
    n_bins: int


def pool_bins(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Merge the least likely bins into one so that every expected count is >= min_expected."""
    counts = np.asarray(counts, dtype=float)
    probs = np.asarray(probs, dtype=float)
    expected = probs / probs.sum() * counts.sum()
    order = np.argsort(-expected, kind="stable")
    keep = order[expected[order] >= min_expected]
    rest = order[expected[order] < min_expected]
    obs, exp = list(counts[keep]), list(expected[keep])
    if len(rest):
        obs.append(counts[rest].sum())
        exp.append(expected[rest].sum())
        # A tail too thin even when pooled joins the smallest kept bin.
        if exp[-1] < min_expected and len(exp) > 1:
            tail_obs, tail_exp = obs.pop(), exp.pop()
            obs[-1] += tail_obs
            exp[-1] += tail_exp
    return np.array(obs), np.array(exp)


def chi_square(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson chi-square of ``counts`` against ``probs`` (pooling a thin tail first)."""
    counts = np.asarray(counts, dtype=float)
    if counts.sum() <= 0:
        raise ValueError("chi_square needs at least one observation; got an all-zero count vector")
    if counts.shape != np.shape(probs):
        raise ValueError(f"counts has shape {counts.shape} but probs has shape {np.shape(probs)}")
    obs, exp = pool_bins(counts, probs, min_expected)
    if len(obs) < 2:
        return ChiSquareResult(0.0, 1.0, 0, len(obs))
    res = stats.chisquare(obs, exp)
    return ChiSquareResult(float(res.statistic), float(res.pvalue), len(obs) - 1, len(obs))


def chi_square_top(counts: np.ndarray, probs: np.ndarray, n_top: int = 60,
                   min_expected: float = 5.0) -> ChiSquareResult:
    """Chi-square over the ``n_top`` most likely tokens under ``probs`` plus one pooled remainder."""
    probs = np.asarray(probs, dtype=float)
    counts = np.asarray(counts, dtype=float)
    top = np.argsort(-probs, kind="stable")[:n_top]
    mask = np.ones(probs.shape[0], dtype=bool)
    mask[top] = False
    c = np.append(counts[top], counts[mask].sum())
    p = np.append(probs[top], probs[mask].sum())
    return chi_square(c, p, min_expected)


def chi_square_power(true_probs: np.ndarray, null_probs: np.ndarray, n: int, level: float = 0.01,
                     sims: int = 200, n_top: int = 60, seed: int = 0) -> float:
    """Share of simulated samples of size n from ``true_probs`` that chi_square_top rejects against ``null_probs``.

    The power of the test to notice that a rule samples ``true_probs`` instead of the target's
    ``null_probs``; close to ``level`` when the two are nearly equal (the test cannot tell).
    """
    rng = np.random.default_rng(seed)
    true_probs = np.asarray(true_probs, dtype=float)
    true_probs = true_probs / true_probs.sum()
    rejected = sum(chi_square_top(rng.multinomial(n, true_probs), null_probs, n_top).pvalue < level
                   for _ in range(sims))
    return rejected / sims


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
