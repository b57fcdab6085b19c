"""Whether to speculate, from a configuration's speed-up over plain decoding and its interval: one rule for the
report's answer (analysis/answer.py), an engine's answer (analysis/engines.py) and the line a job ends with
(pipeline/jobs/verdict.py).
Same concept, other floor: ``pipeline/jobs/verdict.py``."""
from __future__ import annotations

from speclab.stats.intervals import runs_needed

SPECULATE, UNCLEAR, USE_PLAIN = "speculate", "unclear", "use plain"
# What each verdict shows, in the words the report's legend and a job's verdict line use: "slower" only where the
# interval lies below 1; a median below 1 whose interval reaches above 1 is not shown slower, only not faster.
SHOWS = {SPECULATE: "faster than plain", UNCLEAR: "not shown faster than plain", USE_PLAIN: "slower than plain"}


def shows(said: str) -> str:
    """What a verdict shows ("" for no verdict: too few runs)."""
    return SHOWS.get(said, "")


def verdict(speedup: float, lo: float, hi: float, runs: int | None = None, level: float = 0.95) -> str:
    """``speculate`` (interval above 1), ``use plain`` (interval below 1: shown to lose), else ``unclear`` (not told
    apart from plain, a median below 1 included); no verdict without an interval: ``too few runs (n of N)``, N the
    fewest runs an interval at ``level`` needs."""
    if lo != lo:
        have = "" if runs is None else f"{int(runs)} of "
        return f"too few runs ({have}{runs_needed(level)})"
    if hi < 1:
        return USE_PLAIN
    if lo > 1:
        return SPECULATE
    return UNCLEAR


HOLDS, DIFFERS = "holds", "differs"


def agreement(published: float, lo: float, hi: float, runs: int | None = None, level: float = 0.95) -> str:
    """Whether a published median holds on a new measurement: ``holds`` where it lies in the new interval,
    ``differs (slower here)`` / ``differs (faster here)`` where the interval lies below / above it; no verdict
    without an interval: ``too few runs here (n of N)``."""
    if lo != lo:
        have = "" if runs is None else f"{int(runs)} of "
        return f"too few runs here ({have}{runs_needed(level)})"
    if hi < published:
        return f"{DIFFERS} (slower here)"
    if lo > published:
        return f"{DIFFERS} (faster here)"
    return HOLDS
