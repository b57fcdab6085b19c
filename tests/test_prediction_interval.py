"""An interval for an unseen prompt of a kind (speclab.stats.intervals.prediction_interval), checked by simulation the way the
speed-up intervals are: kinds whose prompts differ (heterogeneous within a kind), known true speed-ups per prompt,
the interval built on n sample prompts and checked against one more prompt of the kind. The interval the plan
reports today (an interval of the sample's median) covers an unseen prompt far less often than its level."""
import numpy as np
import pytest

from speclab.stats.intervals import median_ci, prediction_interval, prediction_size_needed

REPS = 4000


def _kind_prompts(rng: np.random.Generator, n: int) -> np.ndarray:
    """True speed-ups of n + 1 prompts of one kind: a kind-level centre, prompts spread around it (skewed)."""
    centre = rng.uniform(0.9, 2.0)
    return centre * rng.lognormal(0.0, 0.25, size=n + 1)


@pytest.mark.parametrize("n", [2, 4, 8, 20])
def test_the_interval_covers_an_unseen_prompt_as_often_as_it_says(n):
    rng = np.random.default_rng(n)
    hits, stated = 0, None
    for _ in range(REPS):
        x = _kind_prompts(rng, n)
        pi = prediction_interval(x[:n], level=0.9)
        stated = pi.coverage
        hits += pi.lo <= x[n] <= pi.hi
    se = np.sqrt(stated * (1 - stated) / REPS)
    assert abs(hits / REPS - stated) < 4 * se, (n, hits / REPS, stated)
    assert stated == pytest.approx((n - 1) / (n + 1) if n < 19 else 19 / 21)  # the range below 19 prompts; j=1 at 20
    assert prediction_interval(np.arange(n, dtype=float), 0.9).enough == (n >= prediction_size_needed(0.9))


def test_the_fewest_prompts_for_a_level():
    assert prediction_size_needed(0.9) == 19 and prediction_size_needed(0.5) == 3
    pi = prediction_interval(np.arange(39, dtype=float), 0.9)
    assert pi.enough and pi.coverage >= 0.9 and (pi.lo, pi.hi) == (1.0, 37.0)  # j = 2: 36/40
    assert np.isnan(prediction_interval([1.2], 0.9).lo)


def test_an_interval_of_the_median_is_not_one_for_an_unseen_prompt():
    """The old plan interval (the median's, here at 90% from 8 prompts) covers a new prompt well below 90%."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(REPS):
        x = _kind_prompts(rng, 8)
        lo, hi = median_ci(x[:8], 0.9)
        hits += lo <= x[8] <= hi
    assert hits / REPS < 0.75
