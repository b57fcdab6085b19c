"""The intervals the report puts on a speed-up hold their level: simulated adjacent-run ratios (seeded) under
log-normal, drifting and heavy-tailed noise, at every number of runs the report can show."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.interval_coverage import RUNS, paired_blocks, ratios, true_paired_median
from speclab.stats.intervals import median_ci, runs_needed

TRIALS = 2000
# The fast tier simulates log-normal noise; drifting and heavy-tailed noise are the slow tier's battery (make test-all).
NOISES = ["lognormal", pytest.param("drift", marks=pytest.mark.slow), pytest.param("heavy", marks=pytest.mark.slow)]


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_the_median_interval_holds_its_level_at_every_number_of_runs(noise, level):
    rng = np.random.default_rng(7)
    margin = 3 * np.sqrt(level * (1 - level) / TRIALS)  # simulation error
    for n in RUNS:
        x = ratios(noise, n, rng)
        ci = np.array([median_ci(row, level) for row in x])
        if n < runs_needed(level):
            assert np.isnan(ci).all(), f"an interval from {n} runs at level {level}"
            continue
        covered = np.mean((ci[:, 0] <= 1) & (1 <= ci[:, 1]))
        assert covered >= level - margin, f"{noise}, n={n}: coverage {covered:.3f} < {level}"


def test_runs_needed_is_the_fewest_runs_whose_widest_interval_reaches_the_level():
    assert runs_needed(0.95) == 6 and runs_needed(0.9) == 5 and runs_needed(0.75) == 3
    for level in (0.5, 0.75, 0.9, 0.95, 0.99):
        n = runs_needed(level)
        assert 1 - 2 * 0.5 ** n >= level > 1 - 2 * 0.5 ** (n - 1)
    with pytest.raises(ValueError, match="level 1.5 is not allowed"):
        runs_needed(1.5)


def test_the_interval_is_the_order_statistics_binomial_coverage_picks():
    x = np.arange(1.0, 31.0)  # 30 runs: j = 10 (coverage 0.957; j = 11: 0.901)
    assert median_ci(x, 0.95) == (10.0, 21.0)
    assert median_ci(np.array([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]), 0.95) == (1.0, 6.0)
    assert median_ci(np.array([1.0, np.nan, 2.0, 3.0, 4.0, 5.0, 6.0]), 0.95) == (1.0, 6.0)
    assert all(np.isnan(median_ci(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 0.95)))


@pytest.mark.parametrize("noise", NOISES)
def test_the_difference_interval_holds_its_level(noise):
    """best - runner-up (analysis.answer.difference_ci): two arms whose medians differ by 0.2."""
    from analysis.answer import difference_ci

    rng = np.random.default_rng(11)
    level, trials = 0.95, 1000
    margin = 3 * np.sqrt(level * (1 - level) / trials)
    for n in RUNS:
        a, b = 1.2 * ratios(noise, n, rng, trials), ratios(noise, n, rng, trials)
        ci = np.array([difference_ci(x, y, level=level)[1:] for x, y in zip(a, b)])
        if n < runs_needed(1 - (1 - level) / 2):
            assert np.isnan(ci).all(), f"a difference interval from {n} runs each"
            continue
        covered = np.mean((ci[:, 0] <= 0.2) & (0.2 <= ci[:, 1]))
        assert covered >= level - margin, f"{noise}, n={n}: coverage {covered:.3f} < {level}"


@pytest.mark.parametrize("noise", NOISES)
def test_the_paired_difference_interval_holds_its_level(noise):
    """best - runner-up over shared blocks (analysis.answer.paired_difference): the median of per-block differences."""
    import pandas as pd

    from analysis.answer import BLOCK_KEYS, RATIO, paired_difference

    rng = np.random.default_rng(13)
    truth = true_paired_median(noise, rng)
    level, trials = 0.95, 1000
    margin = 3 * np.sqrt(level * (1 - level) / trials)
    for n in RUNS:
        d = paired_blocks(noise, n, rng, trials)
        keys = {k: 0 for k in BLOCK_KEYS} | {"block": np.arange(n)}
        found = paired_difference(pd.DataFrame({**keys, RATIO: d[0]}), pd.DataFrame({**keys, RATIO: 0.0}), level)
        if n < runs_needed(level):
            assert found is None, f"a paired interval from {n} blocks"
            continue
        assert found[1:3] == median_ci(d[0], level)  # the answer's paired interval is the median's of the differences
        ci = np.array([median_ci(row, level) for row in d])
        covered = np.mean((ci[:, 0] <= truth) & (truth <= ci[:, 1]))
        assert covered >= level - margin, f"{noise}, n={n}: coverage {covered:.3f} < {level}"
