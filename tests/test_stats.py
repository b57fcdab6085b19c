import numpy as np
import pytest

from speclab.stats import chi_square, chi_square_top, pool_bins


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
