import math

import numpy as np
import pytest

from speclab.cost_model import best_k, break_even_alpha, expected_tokens_per_iteration, predicted_speedup


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
