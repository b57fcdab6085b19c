"""The geometric-series cost model of speculative decoding.

Costs are ratios to one plain target step: ``c_draft`` = draft step / target step,
``c_verify`` = target pass over the k+1 verified positions / target step.
Functions broadcast over numpy arrays so a whole (alpha, k) grid is one call.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

ArrayLike = float | np.ndarray


def _check_alpha_k(alpha: ArrayLike, k: ArrayLike) -> None:
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha={alpha} is not allowed: acceptance rates lie in [0, 1]")
    if np.any(np.asarray(k) < 1):
        raise ValueError(f"k={k} is not allowed: the number of proposals must be >= 1")


def expected_tokens_per_iteration(alpha: ArrayLike, k: ArrayLike) -> ArrayLike:
    """E[tokens per target pass] = (1 - alpha^(k+1)) / (1 - alpha), and k + 1 at alpha = 1."""
    _check_alpha_k(alpha, k)
    a = np.asarray(alpha, dtype=float)
    kk = np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a < 1.0, (1.0 - a ** (kk + 1)) / (1.0 - a), kk + 1.0)
    return float(out) if out.ndim == 0 else out


def iteration_cost(k: ArrayLike, c_draft: float, c_verify: float, overhead: float = 0.0) -> ArrayLike:
    """Cost of one iteration in target steps: k draft steps, one verification pass, fixed overhead."""
    return np.asarray(k, dtype=float) * c_draft + c_verify + overhead


def predicted_speedup(alpha: ArrayLike, k: ArrayLike, c_draft: float, c_verify: float = 1.0,
                      overhead: float = 0.0) -> ArrayLike:
    """Tokens per second relative to plain decoding: E[tokens] / iteration cost."""
    out = np.asarray(expected_tokens_per_iteration(alpha, k)) / iteration_cost(k, c_draft, c_verify, overhead)
    return float(out) if np.ndim(out) == 0 else out


def break_even_alpha(k: int, c_draft: float, c_verify: float = 1.0, overhead: float = 0.0) -> float:
    """Acceptance rate at which speculation matches plain decoding.

    0.0 when it pays even with no accepted proposal; nan when it cannot pay at any alpha.
    """
    _check_alpha_k(0.0, k)
    cost = float(iteration_cost(k, c_draft, c_verify, overhead))
    if cost <= 1.0:
        return 0.0
    if cost >= k + 1:
        return float("nan")
    return float(brentq(lambda a: expected_tokens_per_iteration(a, k) - cost, 0.0, 1.0, xtol=1e-12))


def best_k(alpha: float, c_draft: float, c_verify: float | dict[int, float] = 1.0,
           k_max: int = 10, overhead: float = 0.0) -> int:
    """The k in 1..k_max with the highest predicted speed-up (c_verify may depend on k)."""
    ks = range(1, k_max + 1)
    cv = (lambda k: c_verify[k]) if isinstance(c_verify, dict) else (lambda k: c_verify)
    return max(ks, key=lambda k: predicted_speedup(alpha, k, c_draft, cv(k), overhead))
