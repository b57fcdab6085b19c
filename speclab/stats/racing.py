"""Sequential measurement in blocks: which arms stay in the race, and when one kind's runs may stop.

Every block runs plain decoding and each arm still in the race once, back to back, so an arm's per-block log
speed-up ``log(tokens_per_s / plain's tokens_per_s)`` and the paired difference of two arms in the same block
cancel the machine's slow drift. After every block (or every round over a kind's prompts) the race looks at the
blocks so far:

- an arm is *dropped* when a one-sided t bound on its mean paired log difference to the leader (the arm, or plain
  decoding, with the highest mean) lies below 0. Each test runs at ``(1 - level) / ((arms - 1) * looks)``: the true
  best is dropped only when one of its tests against some other arm at some look errs, so over every look and every
  rival the chance of dropping it stays under ``1 - level`` (Bonferroni; the looks are the block counts the budget
  allows from ``FIRST_LOOK`` on, every ``every`` blocks). Plain decoding is a rival like the others, but it keeps running: the ratios need it.
- the kind *stops*, once it has the blocks an interval needs (``runs_needed(level)``: the verdict needs one), when
  every rival of the leader is out (``decided``), or when each arm still in the race has a distribution-free interval of its median speed-up (``speclab.stats.intervals.median_ci`` at ``level``, the report's) no
  wider than ``2 * precision`` (``precision``); the caller stops it when the budget is spent.

Pure functions of the per-block log speed-ups: the speed stage feeds them, the coverage simulation
(benchmarks/race_simulation.py) checks the error rate.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from speclab.stats.intervals import median_ci, runs_needed

FIRST_LOOK = 4  # the first block count a drop is tested at: with 3 blocks (2 degrees of freedom) the corrected bound
#                 is too wide to drop anything, and a look that can never drop would spend error rate for nothing
DECIDED, PRECISION = "decided", "precision"


@dataclass(frozen=True)
class RaceRule:
    """How sure a drop and a stop must be. ``max_blocks``: the most blocks of one kind the budget allows (the looks
    the correction covers); ``race``: drop arms; ``precision``: stop at this interval half-width (None: never);
    ``every``: the caller looks after every this many blocks (a kind's prompts, so that each look sees each prompt
    equally often); ``corrected`` False tests every drop at ``1 - level``, as if there were one look and one rival
    (only to show what the correction buys: benchmarks/race_simulation.py)."""
    level: float = 0.95
    max_blocks: int = 12
    race: bool = True
    precision: float | None = None
    every: int = 1
    corrected: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.level < 1:
            raise ValueError(f"level {self.level!r} is not allowed: need 0 < level < 1")
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks {self.max_blocks!r} is not allowed: need an integer >= 1")
        if self.precision is not None and not self.precision > 0:
            raise ValueError(f"precision {self.precision!r} is not allowed: need a number > 0 or None")
        if self.every < 1:
            raise ValueError(f"every {self.every!r} is not allowed: need an integer >= 1")

    def looks(self) -> int:
        """The looks that can drop an arm: every ``every`` blocks from ``FIRST_LOOK`` blocks to ``max_blocks``."""
        return max(sum(1 for n in range(FIRST_LOOK, self.max_blocks + 1) if n % self.every == 0), 1)

    def looks_at(self, blocks: int) -> bool:
        return blocks % self.every == 0

    def test_alpha(self, contenders: int) -> float:
        """The one-sided error rate of each drop test when ``contenders`` arms (plain included) start the race."""
        if not self.corrected:
            return 1 - self.level
        return (1 - self.level) / (max(contenders - 1, 1) * self.looks())


def upper_bound(d: np.ndarray, alpha: float) -> float:
    """One-sided (1 - alpha) upper t bound of the mean of ``d``; +inf below two values."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < 2:
        return float("inf")
    return float(d.mean() + stats.t.ppf(1 - alpha, n - 1) * d.std(ddof=1) / np.sqrt(n))


def half_width(log_speedups: np.ndarray, level: float) -> float:
    """Half the width of the median speed-up's distribution-free interval (NaN: too few blocks for one)."""
    lo, hi = median_ci(np.exp(np.asarray(log_speedups, dtype=float)), level)
    return (hi - lo) / 2


@dataclass
class Look:
    """What one look decided: the leader, the arms it drops (each with its reason) and whether the kind stops."""
    leader: Hashable
    dropped: dict[Hashable, str] = field(default_factory=dict)
    stop: str | None = None


def look(log_speedups: Mapping[Hashable, np.ndarray], plain: Hashable, rule: RaceRule, contenders: int,
         name=str) -> Look:
    """One look at the arms still in the race. ``log_speedups``: each of them with its per-block log speed-up over
    the same blocks (``plain``'s all zero, while plain is in the race: it keeps running when it is out, the ratios
    need it, but it no longer leads or counts); ``contenders``: the arms (plain included) that started the race,
    which fixes each test's error rate; ``name``: how a reason names an arm."""
    arms = list(log_speedups)
    y = {a: np.asarray(log_speedups[a], dtype=float) for a in arms}
    lengths = {len(v) for v in y.values()}
    if len(lengths) > 1:
        raise ValueError(f"the arms' blocks differ in number ({ {name(a): len(v) for a, v in y.items()} }): "
                         "a look needs every arm in the race in the same blocks")
    n = lengths.pop() if lengths else 0
    leader = max(arms, key=lambda a: (float(y[a].mean()) if n else 0.0, a == plain))
    out = Look(leader)
    if rule.race and n >= FIRST_LOOK:
        alpha = rule.test_alpha(contenders)
        for a in arms:
            if a == leader:
                continue
            bound = upper_bound(y[a] - y[leader], alpha)
            if bound < 0:
                out.dropped[a] = (f"slower than {name(leader)} after {n} blocks (speed-up ratio at most "
                                  f"{np.exp(bound):.3f}, one-sided at {1 - alpha:.5f})")
    staying = [a for a in arms if a not in out.dropped]
    if n < runs_needed(rule.level):  # a kind stops with an interval for every arm still in it, or not at all
        return out
    if rule.race and staying == [leader] and contenders > 1:
        out.stop = DECIDED
    elif rule.precision is not None:
        widths = [half_width(y[a], rule.level) for a in staying if a != plain]
        if widths and all(w <= rule.precision for w in widths):
            out.stop = PRECISION
    return out
