"""The engine time model (speclab.costs.engine_time) on hand numbers: passes = n - accepted, predicted time =
passes * (d * t_D + t_V(d + 1)) with d = drafted / passes, plain time = n * t_T."""
from __future__ import annotations

import numpy as np
import pytest

from speclab.costs.engine_time import (Counters, EngineCosts, PassCurve, iid_speedup, predict, predicted_speedups,
                                 with_prompt)

# target step 10 ms, draft step 2 ms, a check of 2 proposals (3 tokens) 12 ms, of 4 (5 tokens) 16 ms
COSTS = EngineCosts.from_timings(0.010, 0.002, {3: 0.012, 5: 0.016})


def test_pass_curve_interpolates_and_extends_in_a_straight_line():
    assert COSTS.verify.time(1) == pytest.approx(0.010)  # the target step is the one-token pass
    assert COSTS.verify.time(2.5) == pytest.approx(0.0115)  # between 1 and 3
    assert COSTS.verify.time(4) == pytest.approx(0.014)
    assert COSTS.verify.time(6) == pytest.approx(0.018)  # beyond 5: the slope of 3..5 (2 ms a token)
    np.testing.assert_allclose(COSTS.verify.time(np.array([1.0, 3.0, 7.0])), [0.010, 0.012, 0.020])
    one = PassCurve.from_points({1: 0.01})
    assert one.time(4.0) == pytest.approx(0.01)  # one timed length: flat
    assert PassCurve.from_points({1: 0.01, 3: float("nan")}).lengths == (1.0,)  # NaN times are left out
    with pytest.raises(ValueError, match="at least one"):
        PassCurve.from_points({})
    with pytest.raises(ValueError, match="pass length 0"):
        PassCurve.from_points({0: 0.01})


def test_prediction_by_hand_whole_proposals_per_pass():
    # 48 tokens, 60 drafted, 36 accepted: 12 passes of 5 proposals, each 5 draft steps + a 6-token pass (18 ms)
    p = predict(COSTS, Counters(48, 60, 36))
    assert p.passes == 12 and p.drafted_per_pass == 5
    assert p.speculative_s == pytest.approx(12 * (5 * 0.002 + 0.018))  # 0.336 s
    assert p.plain_s == pytest.approx(48 * 0.010)
    assert p.speedup == pytest.approx(0.48 / 0.336)


def test_prediction_by_hand_fractional_proposals_per_pass():
    # 40 tokens, 30 drafted, 20 accepted: 20 passes of 1.5 proposals, the pass over 2.5 tokens 11.5 ms
    p = predict(COSTS, Counters(40, 30, 20))
    assert p.speculative_s == pytest.approx(20 * (1.5 * 0.002 + 0.0115))
    assert p.speedup == pytest.approx(0.40 / 0.29)


def test_ngram_drafter_drafts_for_free_and_nothing_drafted_is_plain():
    free = COSTS.without_draft()
    p = predict(free, Counters(48, 12, 6))  # 42 passes, 2/7 proposals a pass
    assert p.speculative_s == pytest.approx(42 * (0.010 + (12 / 42) * 0.001))
    assert p.speedup == pytest.approx(0.48 / 0.432)
    assert predict(free, Counters(48, 0, 0)).speedup == pytest.approx(1.0)
    # a draft model that proposes and has nothing accepted is slower than plain by its own costs
    assert predict(COSTS, Counters(10, 20, 0)).speedup == pytest.approx(0.1 / (10 * (2 * 0.002 + 0.012)))  # 0.625


def test_vectorised_form_and_bad_counters():
    got = predicted_speedups(COSTS, np.array([48, 40, np.nan]), np.array([60, 30, 1]), np.array([36, 20, 0]))
    np.testing.assert_allclose(got[:2], [0.48 / 0.336, 0.40 / 0.29])
    assert np.isnan(got[2])
    with pytest.raises(ValueError, match="accepted <= drafted"):
        predict(COSTS, Counters(10, 2, 3))
    assert np.isnan(predict(COSTS, Counters(5, 5, 5)).speedup)  # no pass at all: nothing to price


def test_prompt_time_on_both_sides_and_the_drafts_on_one():
    p = with_prompt(predict(COSTS, Counters(48, 60, 36)), 0.12, 0.03)
    assert (p.speculative_s, p.plain_s) == pytest.approx((0.336 + 0.15, 0.48 + 0.12))
    assert p.speedup == pytest.approx(0.60 / 0.486)  # 1.43 decode-only, 1.23 with the prompt read
    got = predicted_speedups(COSTS, np.array([48]), np.array([60]), np.array([36]), np.array([0.12]), np.array([0.03]))
    assert got[0] == pytest.approx(0.60 / 0.486)


def test_iid_form_by_hand():
    # alpha 0.8, k 4: (1 - 0.8^5) / 0.2 = 3.3616 tokens per pass, at 4 * 0.2 + 1.6 = 2.4 target steps
    assert iid_speedup(COSTS, 0.8, 4) == pytest.approx(3.3616 / 2.4)
    assert iid_speedup(COSTS.without_draft(), 0.5, 2) == pytest.approx(1.75 / 1.2)
    assert np.isnan(iid_speedup(COSTS, float("nan"), 4)) and np.isnan(iid_speedup(COSTS, 0.5, 0))
