import numpy as np
import pytest

from speclab.stats.intervals import bootstrap_interval, median_ci, runs_needed



from speclab.stats.goodness_of_fit import chi_square, chi_square_top, pool_bins
def test_pooling_keeps_totals_and_minimum_expected():
    rng = np.random.default_rng(0)
    for n_bins, conc, n in [(64, 0.3, 3000), (16, 1.0, 100), (200, 0.1, 500)]:
        p = rng.dirichlet(np.full(n_bins, conc))
        p[rng.integers(0, n_bins, 3)] = 0.0  # impossible bins are pooled too
        counts = rng.multinomial(n, p / p.sum())
        obs, exp = pool_bins(counts, p)
        assert obs.sum() == n and exp.sum() == pytest.approx(n)
        assert exp.min() >= 5.0 or len(exp) == 1


def test_chi_square_accepts_truth_and_rejects_other():
    rng = np.random.default_rng(1)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    assert chi_square(rng.multinomial(5000, p), p).pvalue > 0.001
    assert chi_square(rng.multinomial(5000, [0.25] * 4), p).pvalue < 1e-6


def test_chi_square_top_pools_remainder():
    p = np.full(100, 0.01)
    res = chi_square_top(np.full(100, 10.0), p, n_top=60)
    assert res.n_bins == 61 and res.pvalue == pytest.approx(1.0)


def test_chi_square_bad_input():
    with pytest.raises(ValueError, match="all-zero"):
        chi_square(np.zeros(3), np.ones(3) / 3)


def test_a_thin_pooled_tail_merges_into_the_smallest_kept_bin():
    """Expected 50, 30, 16, 2.4, 1.6 (n = 100): the pooled tail (4) is still below 5, so it joins the 16 bin;
    nothing is dropped and the kept bins keep their order (most likely first)."""
    probs = np.array([0.50, 0.30, 0.16, 0.024, 0.016])
    counts = np.array([48, 33, 12, 4, 3])
    obs, exp = pool_bins(counts, probs)
    assert obs.tolist() == [48, 33, 19]
    assert np.allclose(exp, [50, 30, 20])


def test_a_tail_reaching_the_minimum_is_its_own_bin():
    probs = np.array([0.60, 0.30, 0.06, 0.04])  # expected 60, 30, 6, 4: the two thin bins pool to 10
    obs, exp = pool_bins(np.array([58, 31, 7, 4]), probs)
    assert obs.tolist() == [58, 31, 7, 4][:2] + [11] and np.allclose(exp, [60, 30, 10])
    obs, exp = pool_bins(np.array([58, 31, 7, 4]), probs, min_expected=4.0)  # 4 is enough: nothing pooled
    assert obs.tolist() == [58, 31, 7, 4] and np.allclose(exp, [60, 30, 6, 4])


def test_chi_square_statistic_and_dof_by_hand():
    counts, probs = np.array([30, 50, 20]), np.array([0.25, 0.5, 0.25])
    res = chi_square(counts, probs)
    stat = (30 - 25) ** 2 / 25 + 0 + (20 - 25) ** 2 / 25
    assert res.statistic == pytest.approx(stat) and res.dof == 2 and res.n_bins == 3
    assert res.pvalue == pytest.approx(np.exp(-stat / 2))  # chi-square with 2 dof: survival exp(-x/2)
    one = chi_square(np.array([10, 0]), np.array([1.0, 0.0]))  # everything in one bin: nothing to test
    assert (one.statistic, one.pvalue, one.dof, one.n_bins) == (0.0, 1.0, 0, 1)


def test_chi_square_top_keeps_the_most_likely_tokens():
    probs = np.array([0.05, 0.4, 0.05, 0.3, 0.2])
    counts = np.array([5, 40, 5, 30, 20])
    res = chi_square_top(counts, probs, n_top=3)  # tokens 1, 3, 4 kept, 0 and 2 pooled (expected 10)
    assert res.n_bins == 4 and res.statistic == pytest.approx(0.0)
    skewed = chi_square_top(np.array([10, 40, 0, 30, 20]), probs, n_top=3)
    assert skewed.statistic == pytest.approx(0.0)  # only the pooled remainder is compared


def test_chi_square_power_separates_near_and_far_distributions():
    from speclab.stats.goodness_of_fit import chi_square_power

    null = np.array([0.4, 0.3, 0.2, 0.1])
    assert chi_square_power(null, null, 2000, sims=100) < 0.1
    assert chi_square_power(np.array([0.25] * 4), null, 2000, sims=50) == 1.0
    far = chi_square_power(np.array([0.37, 0.3, 0.2, 0.13]), null, 500, sims=100, seed=1)
    assert 0.1 < far < 1.0  # a small shift at a small n: detected sometimes, so the count itself matters


def test_median_interval_takes_the_order_statistic_whose_coverage_equals_the_level():
    """At a level equal to an order statistic's exact coverage, 1 - 2 P(Binomial(n, 1/2) < j), that pair is the
    interval: (x_(2), x_(9)) of 10 runs at 1 - 2 * 11/1024, (x_(1), x_(6)) of 6 runs at 1 - 2/64."""
    assert median_ci(np.arange(10.0), 1 - 2 * 11 / 1024) == (1.0, 8.0)
    assert median_ci(np.arange(6.0), 1 - 2 / 64) == (0.0, 5.0)
    assert median_ci(np.arange(10.0), 0.95) == (1.0, 8.0)  # the widest pair is never taken when a narrower holds


def test_median_interval_drops_missing_values_given_as_none():
    """A run without a ratio (None or NaN) is left out, not counted: six values and a gap are six runs."""
    assert median_ci([5.0, None, 1.0, 2.0, 3.0, 4.0, 6.0], 0.95) == (1.0, 6.0)
    assert np.isnan(median_ci([1.0, 2.0, None, 3.0, 4.0, 5.0], 0.95)).all()  # five runs: none at 95%


def test_runs_needed_at_the_default_level_and_its_range():
    """95% (the default) needs 6 runs; a level outside (0, 1) is refused with its value."""
    assert runs_needed() == 6 and runs_needed(0.9) == 5
    for bad in (0, 0.0, 1, -0.1):
        with pytest.raises(ValueError, match=f"level {bad!r} is not allowed: need 0 < level < 1"):
            runs_needed(bad)


def test_bootstrap_interval_of_nothing_one_value_and_two():
    """No values (or only NaNs): no interval; one value or identical values: that value twice; two different
    values: the resamples spread between them."""
    for empty in ([], [float("nan")]):
        lo, hi = bootstrap_interval(empty)
        assert np.isnan(lo) and np.isnan(hi)
    assert bootstrap_interval([3.0]) == (3.0, 3.0) and bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert bootstrap_interval([1.0, 2.0]) == (1.0, 2.0)


def test_bootstrap_interval_uses_its_level():
    """A 50% interval is narrower than the 95% one of the same resamples."""
    assert bootstrap_interval(np.arange(10.0), level=0.5) == (3.5, 5.5)
    assert bootstrap_interval(np.arange(10.0)) == (2.0, 7.0)
