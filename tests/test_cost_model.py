import math

import numpy as np
import pytest

from speclab.costs.cost_model import (
    best_k,
    break_even_alpha,
    expected_tokens_per_iteration,
    iteration_cost,
    predicted_speedup,
)


def test_expected_tokens_limits():
    for k in (1, 2, 4, 8):
        assert expected_tokens_per_iteration(0.0, k) == pytest.approx(1.0)
        assert expected_tokens_per_iteration(1.0, k) == pytest.approx(k + 1)
    # continuity at alpha -> 1
    assert expected_tokens_per_iteration(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)
    assert expected_tokens_per_iteration(0.5, 2) == pytest.approx(1.75)


def test_expected_tokens_broadcasts():
    out = expected_tokens_per_iteration(np.array([0.0, 0.5, 1.0]), 2)
    assert np.allclose(out, [1.0, 1.75, 3.0])


def test_speedup_crosses_one_at_break_even():
    for k, cd, cv in [(1, 0.33, 1.1), (4, 0.33, 1.3), (6, 0.56, 0.9)]:
        a = break_even_alpha(k, cd, cv)
        assert 0 < a < 1
        assert predicted_speedup(a, k, cd, cv) == pytest.approx(1.0, abs=1e-9)
        assert predicted_speedup(a - 0.02, k, cd, cv) < 1 < predicted_speedup(a + 0.02, k, cd, cv)


def test_break_even_edges():
    assert break_even_alpha(2, 0.0, 0.9) == 0.0  # free draft and cheap check: always pays
    assert math.isnan(break_even_alpha(2, 1.2, 1.0))  # draft slower than target: never pays


def test_chapter_figure_breakeven():
    # The chapter's pair: c = 0.56 with verification about one target step gives ~0.49 at k = 1.
    assert break_even_alpha(1, 0.56, 1.0) == pytest.approx(0.56, abs=0.01)
    assert break_even_alpha(1, 0.555, 0.94) == pytest.approx(0.495, abs=0.01)


def test_best_k_moves_with_alpha():
    assert best_k(0.95, 0.1, 1.0) > best_k(0.5, 0.1, 1.0)


def test_bad_k_and_alpha():
    with pytest.raises(ValueError, match="k=0"):
        expected_tokens_per_iteration(0.5, 0)
    with pytest.raises(ValueError, match="alpha=1.5"):
        expected_tokens_per_iteration(1.5, 2)


def test_iteration_cost_adds_k_draft_steps_the_check_and_the_overhead():
    assert iteration_cost(3, 0.2, 1.3, 0.25) == pytest.approx(3 * 0.2 + 1.3 + 0.25)
    assert np.allclose(iteration_cost(np.array([1, 2]), 0.5, 1.0), [1.5, 2.0])


def test_overhead_lowers_the_speedup_and_raises_break_even():
    a, k, cd, cv = 0.8, 4, 0.2, 1.2
    tokens = (1 - a ** 5) / (1 - a)
    assert predicted_speedup(a, k, cd, cv, overhead=0.3) == pytest.approx(tokens / (4 * 0.2 + 1.2 + 0.3))
    assert break_even_alpha(k, cd, cv, overhead=0.3) > break_even_alpha(k, cd, cv)
    assert best_k(0.8, 0.2, 1.2, overhead=5.0) > best_k(0.8, 0.2, 1.2)  # a fixed cost favours longer k
    assert expected_tokens_per_iteration(a, k) == pytest.approx(tokens)
    assert expected_tokens_per_iteration(1.0, 3) == 4.0 and expected_tokens_per_iteration(0.0, 3) == 1.0


def test_break_even_at_the_edges_of_its_cases():
    assert break_even_alpha(2, 0.0, 1.0) == 0.0  # cost exactly one step: pays at any alpha
    assert math.isnan(break_even_alpha(2, 1.0, 1.0))  # cost exactly k + 1: never pays
    a = break_even_alpha(2, 0.25, 1.0)  # cost 1.5 = 1 + a + a^2 -> a = (sqrt(3) - 1) / 2
    assert a == pytest.approx((math.sqrt(3) - 1) / 2, abs=1e-10)


def test_best_k_reads_a_per_k_verification_cost():
    jagged = {k: 1.0 for k in range(1, 11)}
    jagged[4] = 5.0  # an expensive check at k = 4 only
    assert best_k(0.9, 0.05, jagged, k_max=10) != 4
    assert best_k(0.9, 0.05, 1.0, k_max=3) == 3  # never beyond k_max
    assert best_k(0.3, 0.3, 1.0, k_max=10) == 1
