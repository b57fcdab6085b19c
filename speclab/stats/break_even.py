"""The load at which speculation stops paying: where a gain measured at several loads (concurrent requests) crosses 1.

At each load the gain is the median of its blocks' ratios (speculative over the adjacent plain run at that load,
latency or throughput); between two measured loads it is interpolated linearly in log gain against log load, since
loads are taken in doublings (1, 2, 4, 8). The break-even load is the first crossing from above 1 to at or below 1.
Its interval resamples each load's blocks (a bootstrap, each load on its own: blocks at different loads are
different runs) and takes the crossing's percentiles; a resample that never crosses counts beyond the largest
load, one already below 1 at the smallest load counts below it, so an interval may be open at either end
(``lo_open`` / ``hi_open``). Pure numpy.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BreakEven:
    load: float          # the crossing (inf: no crossing up to the largest load; 0: below 1 already at the smallest)
    lo: float
    hi: float
    lo_open: bool        # the interval's low end is the smallest load measured: the crossing may lie below it
    hi_open: bool        # its high end is the largest load measured: the crossing may lie beyond it
    level: float
    smallest: float      # the loads measured
    largest: float

    def text(self) -> str:
        """``breaks even at 3.1 concurrent requests (95% 2.4 to 4.6)``, or where it lies beyond the loads measured."""
        if self.load == np.inf:
            return f"still gains at {self.largest:g} concurrent requests, the largest load measured"
        if self.load == 0:
            return f"no gain already at {self.smallest:g} concurrent request(s), the smallest load measured"
        lo = f"<= {self.lo:.1f}" if self.lo_open else f"{self.lo:.1f}"
        hi = f">= {self.hi:.1f}" if self.hi_open else f"{self.hi:.1f}"
        return f"breaks even at {self.load:.1f} concurrent requests ({100 * self.level:.0f}% {lo} to {hi})"


def crossing(loads: np.ndarray, gains: np.ndarray) -> float:
    """The first load at which ``gains`` (one per load, ascending loads) falls from above 1 to at or below 1,
    interpolated in log-log; inf where it never does, 0 where the first gain is already at or below 1."""
    g = np.log(np.asarray(gains, dtype=float))
    x = np.log(np.asarray(loads, dtype=float))
    if g[0] <= 0:
        return 0.0
    for i in range(1, len(g)):
        if g[i] <= 0:
            t = g[i - 1] / (g[i - 1] - g[i])
            return float(np.exp(x[i - 1] + t * (x[i] - x[i - 1])))
    return float("inf")


def break_even(ratios: Mapping[int, np.ndarray], level: float = 0.95, samples: int = 2000,
               seed: int = 0) -> BreakEven:
    """``ratios``: per load (concurrent requests), its blocks' gains (speculative over adjacent plain)."""
    if not 0 < level < 1:
        raise ValueError(f"level {level!r} is not allowed: need 0 < level < 1")
    loads = np.array(sorted(ratios), dtype=float)
    if len(loads) < 2 or any(len(ratios[int(c)]) == 0 for c in loads):
        raise ValueError(f"a break-even needs gains at two loads or more, each with a block: got {dict(ratios)}")
    values = [np.asarray(ratios[int(c)], dtype=float) for c in loads]
    point = crossing(loads, np.array([np.median(v) for v in values]))
    rng = np.random.default_rng(seed)
    boot = np.array([crossing(loads, np.array([np.median(rng.choice(v, len(v))) for v in values]))
                     for _ in range(samples)])
    tail = (1 - level) / 2
    smallest, largest = loads[0], loads[-1]
    # no crossing (inf) or one before the smallest load (0): beyond the loads measured, on either side
    lo, hi = np.quantile(np.clip(boot, smallest / 2, 2 * largest), [tail, 1 - tail])
    return BreakEven(point, float(np.clip(lo, smallest, largest)), float(np.clip(hi, smallest, largest)),
                     bool(lo <= smallest), bool(hi >= largest), level, float(smallest), float(largest))
