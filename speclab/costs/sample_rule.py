"""When a plan's sample of a kind is large enough: its recommendation is told apart, at the plan's level and within
a precision, from every other configuration it priced, the multiplicity accounted for.

The recommendation is chosen after the fact, among many configurations, from the same prompts. Comparing it with
the sample's runner-up alone settles on a configuration well below the true best whenever that one ranked third
or lower (benchmarks/plan_sample_simulation.py: 17-27% of samples of 20 configurations with a 7% gap at 10% noise,
against a stated 10%). Here every rival is tested, each one-sided at ``(1 - level) / (rivals * looks)``: a miss needs
the test of the chosen configuration against the true best to err, for one of the ``rivals`` configurations the
choice can fall on, at one of the ``looks`` sample sizes the plan looks at, so the chance of settling more than the
precision below the true best stays under ``1 - level`` (Bonferroni, as the speed stage's race corrects its drops).
Pure numpy: ``speclab.costs.planning.settled`` feeds it a kind's per-prompt predictions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t


@dataclass(frozen=True)
class Bound:
    """The recommendation against its closest rival (the lowest bound): ``rival`` its column, ``margin`` the lower
    bound of the recommendation's geometric-mean speed-up over it, a ratio (NaN below 2 prompts)."""
    rival: int | None
    margin: float
    prompts: int
    rivals: int


def test_alpha(level: float, rivals: int, looks: int = 1) -> float:
    """The one-sided error rate of each comparison."""
    return (1 - level) / (max(rivals, 1) * max(looks, 1))


def closest_rival(values: np.ndarray, at: int, level: float, looks: int = 1, corrected: bool = True) -> Bound:
    """``values``: predicted speed-ups, one row per prompt and one column per configuration (plain included); ``at``:
    the recommendation's column. Per rival, the one-sided lower t bound of the mean of log(recommended / rival) over
    the prompts; the lowest of them. ``corrected`` False tests every rival at ``1 - level`` (only to show what the
    correction buys)."""
    values = np.asarray(values, dtype=float)
    rivals = [j for j in range(values.shape[1]) if j != at]
    if not rivals:
        return Bound(None, float("nan"), len(values), 0)
    logs = np.log(values[:, [at]] / values[:, rivals])
    logs = logs[np.isfinite(logs).all(axis=1)]
    n = len(logs)
    if n < 2:
        return Bound(rivals[0], float("nan"), n, len(rivals))
    alpha = test_alpha(level, len(rivals), looks) if corrected else 1 - level
    bounds = logs.mean(axis=0) - student_t.ppf(1 - alpha, n - 1) * logs.std(axis=0, ddof=1) / np.sqrt(n)
    worst = int(np.argmin(bounds))
    return Bound(rivals[worst], float(np.exp(bounds[worst])), n, len(rivals))


def is_settled(bound: Bound, precision: float) -> bool:
    """No worse than ``precision`` below any rival, at the bound's level: told apart, or within the precision."""
    return bound.margin == bound.margin and bound.margin >= 1 - precision - 1e-12


def looks(start: int, cap: int) -> int:
    """The sample sizes a growing plan looks at: every size from its first sample to its cap."""
    return max(cap - max(start, 2) + 1, 1)
