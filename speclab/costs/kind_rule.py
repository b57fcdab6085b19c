"""Whether a kind takes its own best configuration or the robust one (the best worst case over every sample prompt
of every kind), judged on prompts each choice did not see.

Leave one prompt of the kind out; on the rest choose both the kind's own best (highest median over the kind's other
prompts) and the robust configuration (over every other sample prompt, all kinds); price both on the left-out
prompt. Nothing priced on a prompt was chosen with it. ``RULES`` are the ways to decide from those held-out gains;
benchmarks/plan_rule_simulation.py measures each one's expected regret at the plan's sample sizes and ``RULE`` is
the one it supports. Pure numpy: ``speclab.costs.planning.recommend`` feeds it the per-prompt predictions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t


def robust_column(values: np.ndarray) -> int:
    """The column with the best worst case: the highest minimum, over rows, of its value over the row's best; ties
    to the higher median."""
    values = np.asarray(values, dtype=float)
    share = values / np.nanmax(values, axis=1, keepdims=True)
    worst = np.nanmin(share, axis=0)
    med = np.nanmedian(values, axis=0)
    return int(np.lexsort((med, worst))[-1])


def best_column(values: np.ndarray) -> int:
    """The column with the highest median over the rows."""
    return int(np.nanargmax(np.nanmedian(np.asarray(values, dtype=float), axis=0)))


@dataclass(frozen=True)
class HeldOut:
    """How the kind's own choice fares against the robust one on prompts neither saw (leave one prompt out)."""

    gain: float   # mean over the kind's prompts of (the kind's choice) / (the robust choice) - 1, both made without it
    error: float  # the standard error of that mean (NaN below 2 prompts)
    prompts: int
    beyond: bool  # the kind's own choice is taken (by ``RULE``)


def held_out_gains(values: np.ndarray, in_kind: np.ndarray) -> np.ndarray:
    """``values``: every sample prompt (rows, all kinds) by configuration; ``in_kind``: the rows of the kind. Per row
    of the kind, its value under the kind's choice over its value under the robust choice, both chosen without it."""
    values = np.asarray(values, dtype=float)
    rows = np.flatnonzero(in_kind)
    gains = []
    for i in rows if len(rows) > 1 else ():
        others = np.delete(np.arange(len(values)), i)
        own = best_column(values[np.setdiff1d(rows, [i])])
        robust = robust_column(values[others])
        gains.append(values[i, own] / values[i, robust] - 1)
    g = np.asarray(gains, float)
    return g[~np.isnan(g)]


def beyond_error(g: np.ndarray, level: float) -> bool:
    """The mean held-out gain above 0 by a one-sided t test at ``level``."""
    if len(g) < 2:
        return False
    mean, err = g.mean(), g.std(ddof=1) / np.sqrt(len(g))
    return bool(mean > 0 and mean > student_t.ppf(level, len(g) - 1) * err)


RULES = {
    "robust first": beyond_error,                                  # the kind's own only when its gain passes a t test
    "held-out gain": lambda g, level: bool(len(g) and g.mean() > 0),  # the kind's own when it gains on average
    "kind's best": lambda g, level: True,                         # always the kind's own best median
    "robust": lambda g, level: False,                             # never
}
RULE = "kind's best"  # the least expected regret at 2-8 prompts a kind (benchmarks/plan_rule_simulation.py)


def held_out(values: np.ndarray, in_kind: np.ndarray, level: float, rule: str = RULE) -> HeldOut:
    g = held_out_gains(values, in_kind)
    if not len(g):
        return HeldOut(float("nan"), float("nan"), 0, False)
    err = float(g.std(ddof=1) / np.sqrt(len(g))) if len(g) > 1 else float("nan")
    return HeldOut(float(g.mean()), err, len(g), RULES[rule](g, level))
