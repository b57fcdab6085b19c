"""The planner's per-kind choice (speclab.costs.kind_rule), fully held out: on a left-out prompt both the kind's own
choice and the robust one are made without it; the rule taken is the one with the least expected regret in the
simulation of benchmarks/plan_rule_simulation.py (kinds with known true speed-ups)."""
import numpy as np
import pytest

from benchmarks.plan_rule_simulation import SIZES, rates
from speclab.costs.kind_rule import RULE, held_out_gains, robust_column


def test_the_robust_choice_priced_on_a_left_out_prompt_is_made_without_it():
    # columns a, b; rows x0, x1 (kind X), y0 (kind Y). Over every row the robust column is a (its worst share 0.8
    # against b's 0.5, set by x0); without x0 it is b (worst 1.0 against a's 0.9).
    values = np.array([[2.0, 1.0],    # x0
                       [1.8, 2.0],    # x1
                       [1.0, 1.1]])   # y0
    assert robust_column(values) == 0 and robust_column(values[1:]) == 1
    gains = held_out_gains(values, np.array([True, True, False]))
    # x0 left out: the kind's choice from x1 is b, the robust one from x1 and y0 is b: gain 0.
    # x1 left out: the kind's choice from x0 is a, the robust one from x0 and y0 is a: gain 0.
    assert gains == pytest.approx([0.0, 0.0])
    # Were the robust choice made with the left-out prompt (a, from all rows), x0 would show b / a - 1 = -50%.


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
def test_the_rule_takes_a_kinds_wide_winner_and_regrets_less_than_robust_first(n):
    assert rates("wide", n, RULE, 200)["override"] >= 0.95
    mine = np.mean([rates(s, n, RULE, 200)["regret"] for s in ("wide", "one sd", "tie", "none")])
    robust_first = np.mean([rates(s, n, "robust first", 200)["regret"] for s in ("wide", "one sd", "tie", "none")])
    assert mine <= robust_first, (n, mine, robust_first)


def test_the_simulation_covers_the_plans_sample_sizes():
    assert set(SIZES) >= {2, 4, 8}
