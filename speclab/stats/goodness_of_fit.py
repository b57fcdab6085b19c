"""Goodness-of-fit of sampled counts against a known distribution: chi-square tests and their power."""
from __future__ import annotations

from dataclasses import dataclass

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
