"""The race (speclab.stats.racing) keeps its stated error rate over repeated looks: simulated blocks of plain decoding and
six arms, two of them within 1% of the best, under log-normal, drifting and heavy-tailed noise (seeded;
benchmarks/race_simulation.py). The same simulation without the correction for looks and rivals drops the best arm
three to five times as often as the level allows."""
from __future__ import annotations

import re

import numpy as np
import pytest

from benchmarks.race_simulation import NOISES, summary
from speclab.stats.racing import DECIDED, FIRST_LOOK, PRECISION, RaceRule, half_width, look, upper_bound

TRIALS = 400
LEVEL = 0.95
MARGIN = 3 * np.sqrt(LEVEL * (1 - LEVEL) / TRIALS)  # simulation error of a share near 1 - level
# The fast tier simulates the first noise; the others are the slow tier's battery (make test-all).
NOISE_CASES = [NOISES[0], *(pytest.param(n, marks=pytest.mark.slow) for n in NOISES[1:])]


@pytest.mark.parametrize("noise", NOISE_CASES)
def test_the_race_drops_the_true_best_at_most_as_often_as_its_level_allows(noise):
    s = summary(noise, RaceRule(level=LEVEL, max_blocks=12), TRIALS, np.random.default_rng(5))
    assert s["best_dropped"] <= 1 - LEVEL + MARGIN, s
    assert s["runs_share"] < 0.9, s  # and the clear losers do leave the race


@pytest.mark.parametrize("noise", NOISE_CASES)
def test_without_the_correction_the_best_is_dropped_far_more_often(noise):
    s = summary(noise, RaceRule(level=LEVEL, max_blocks=12, corrected=False), TRIALS, np.random.default_rng(5))
    assert s["best_dropped"] > 1 - LEVEL + MARGIN, s


@pytest.mark.parametrize("noise", NOISE_CASES)
def test_an_interval_stopped_for_its_precision_still_holds_its_level(noise):
    s = summary(noise, RaceRule(level=LEVEL, max_blocks=12, precision=0.25), TRIALS, np.random.default_rng(9))
    assert s["precision_stops"] > 0.5, s
    assert s["precision_miss"] <= 1 - LEVEL + MARGIN, s


def blocks(rng, n, **means):
    return {a: m + rng.normal(0, 0.02, n) if a != "plain" else np.zeros(n) for a, m in means.items()}


def test_a_clear_loser_is_dropped_with_its_reason_and_the_leader_kept():
    y = blocks(np.random.default_rng(0), 6, plain=0, fast=0.4, slow=0.1)
    seen = look(y, "plain", RaceRule(max_blocks=12), contenders=3)
    assert seen.leader == "fast"
    assert set(seen.dropped) == {"slow", "plain"}
    assert seen.dropped["slow"].startswith("slower than fast after 6 blocks (speed-up ratio at most 0.")
    assert seen.stop == DECIDED


def test_no_arm_is_dropped_before_the_first_look_nor_when_the_race_is_off():
    y = blocks(np.random.default_rng(0), FIRST_LOOK - 1, plain=0, fast=0.4, slow=0.1)
    assert look(y, "plain", RaceRule(), 3).dropped == {}
    y = blocks(np.random.default_rng(0), 8, plain=0, fast=0.4, slow=0.1)
    assert look(y, "plain", RaceRule(race=False), 3).dropped == {}
    assert look(y, "plain", RaceRule(race=False), 3).stop is None


def test_a_near_tie_stays_in_the_race_until_the_intervals_are_narrow_enough():
    rng = np.random.default_rng(1)
    y = blocks(rng, 6, plain=0, a=0.3, b=0.301)
    rule = RaceRule(max_blocks=12, precision=0.5)
    seen = look(y, "plain", rule, 3)
    assert "a" not in seen.dropped and "b" not in seen.dropped
    assert seen.stop == PRECISION
    assert look(y, "plain", RaceRule(max_blocks=12, precision=0.001), 3).stop is None
    five = {a: v[:5] for a, v in y.items()}  # five blocks: no 95% interval yet, so no precision either
    assert look(five, "plain", rule, 3).stop is None


def test_plain_leads_when_every_arm_is_slower_and_the_race_is_then_decided():
    y = blocks(np.random.default_rng(2), 6, plain=0, a=-0.3, b=-0.4)
    seen = look(y, "plain", RaceRule(), 3)
    assert seen.leader == "plain" and set(seen.dropped) == {"a", "b"} and seen.stop == DECIDED


def test_more_looks_and_rivals_make_each_test_stricter():
    rule = RaceRule(level=0.95, max_blocks=12)
    assert rule.looks() == 12 - FIRST_LOOK + 1
    assert rule.test_alpha(7) == pytest.approx(0.05 / (6 * 9))
    assert RaceRule(level=0.95, max_blocks=24).test_alpha(7) < rule.test_alpha(7) < rule.test_alpha(3)
    assert RaceRule(corrected=False).test_alpha(7) == pytest.approx(0.05)
    rounds = RaceRule(level=0.95, max_blocks=12, every=3)  # a look after each round over three prompts: 6, 9, 12
    assert rounds.looks() == 3 and rounds.looks_at(6) and not rounds.looks_at(7)


def test_the_upper_bound_is_the_one_sided_t_bound():
    d = np.array([-0.1, -0.2, -0.15, -0.12])
    # mean -0.1425, sd 0.0435 (ddof 1), t(0.95, 3) = 2.3534
    assert upper_bound(d, 0.05) == pytest.approx(-0.1425 + 2.353363 * 0.04349329 / 2, abs=1e-6)
    assert upper_bound(d[:1], 0.05) == float("inf")


@pytest.mark.parametrize("kwargs, message", [
    ({"level": 1.0}, "level 1.0 is not allowed: need 0 < level < 1"),
    ({"max_blocks": 0}, "max_blocks 0 is not allowed: need an integer >= 1"),
    ({"precision": 0.0}, "precision 0.0 is not allowed: need a number > 0 or None"),
    ({"every": 0}, "every 0 is not allowed: need an integer >= 1"),
])
def test_a_bad_rule_is_refused_with_the_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RaceRule(**kwargs)


def test_arms_with_different_numbers_of_blocks_are_refused():
    with pytest.raises(ValueError, match="the arms' blocks differ in number"):
        look({"plain": np.zeros(4), "a": np.ones(3)}, "plain", RaceRule(), 2)


def test_half_width_is_half_the_median_intervals_width_at_the_given_level():
    """half_width: half of (hi - lo) of the median speed-up's interval, at the level asked for."""
    y = np.log([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    # Six blocks: at 95% the interval is (x_1, x_6); at 75% (x_2, x_5) (coverage 1 - 2 * 7/64 = 0.78)
    assert half_width(y, 0.95) == pytest.approx((6 - 1) / 2)
    assert half_width(y, 0.75) == pytest.approx((5 - 2) / 2)


def test_the_arms_block_counts_are_named_in_the_refusal():
    """The refusal of unequal block counts names each arm (as ``name`` spells it) with its count."""
    y = {"plain": np.zeros(4), "a": np.ones(3)}
    message = ("the arms' blocks differ in number ({'arm plain': 4, 'arm a': 3}): "
               "a look needs every arm in the race in the same blocks")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        look(y, "plain", RaceRule(), 2, name=lambda a: f"arm {a}")


def test_a_look_at_no_arms_is_refused_with_a_value_error():
    """A look needs at least one arm: none is refused as a bad value (ValueError), like unequal blocks."""
    with pytest.raises(ValueError):
        look({}, "plain", RaceRule(), 1)


def test_before_any_block_and_on_a_tie_plain_leads():
    """No block yet, or an arm exactly as fast as plain: plain leads, nothing is dropped, the race goes on."""
    seen = look({"a": np.zeros(0), "plain": np.zeros(0), "b": np.zeros(0)}, "plain", RaceRule(), 3)
    assert seen.leader == "plain" and seen.dropped == {} and seen.stop is None
    seen = look({"a": np.zeros(6), "plain": np.zeros(6)}, "plain", RaceRule(), 2)
    assert seen.leader == "plain"
    # The difference to the leader is exactly 0 in every block: its bound is 0, not below 0, so a stays.
    assert seen.dropped == {} and seen.stop is None


def test_the_first_drop_can_come_at_exactly_first_look_blocks_with_its_exact_reason():
    """At FIRST_LOOK blocks a clear loser is already dropped; the reason states the bound and the one-sided level."""
    y = blocks(np.random.default_rng(0), FIRST_LOOK, plain=0, fast=0.4, slow=0.1)
    rule = RaceRule(level=0.95, max_blocks=12)
    seen = look(y, "plain", rule, contenders=3)
    assert seen.leader == "fast" and set(seen.dropped) == {"slow", "plain"}
    alpha = 0.05 / (2 * 9)  # two rivals, looks at 4..12 blocks
    ratio = np.exp(upper_bound(y["slow"] - y["fast"], alpha))
    assert ratio < 1
    assert seen.dropped["slow"] == (f"slower than fast after {FIRST_LOOK} blocks (speed-up ratio at most "
                                    f"{ratio:.3f}, one-sided at 0.99722)")


def test_two_arms_are_decided_when_one_drops_and_a_lone_arm_never_is():
    """Two arms: dropping one decides the kind. One arm alone has no rival to beat: the race never stops it."""
    y = blocks(np.random.default_rng(3), 6, plain=0, fast=0.4)
    seen = look(y, "plain", RaceRule(), 2)
    assert set(seen.dropped) == {"plain"} and seen.stop == DECIDED
    # plain measured alone (a kind with no arm to race) keeps running to its budget
    assert look({"plain": np.zeros(6)}, "plain", RaceRule(), 1).stop is None
    assert look({"fast": y["fast"]}, "plain", RaceRule(), 1).stop is None


def test_precision_is_reached_when_the_half_width_equals_the_precision():
    """The precision stop holds an interval no wider than 2 * precision: a half-width equal to it stops."""
    y = blocks(np.random.default_rng(4), 6, plain=0, a=0.3, b=0.301)
    w = max(half_width(y["a"], 0.95), half_width(y["b"], 0.95))
    assert look(y, "plain", RaceRule(race=False, precision=w), 3).stop == PRECISION
    assert look(y, "plain", RaceRule(race=False, precision=w * (1 - 1e-9)), 3).stop is None


def test_the_upper_bound_is_finite_from_two_values():
    """Two values already give a t bound (one degree of freedom); only fewer give +inf."""
    d = np.array([-0.1, -0.3])
    # mean -0.2, sd / sqrt(2) = 0.1, t(0.95, 1) = 6.313752
    assert upper_bound(d, 0.05) == pytest.approx(-0.2 + 6.313752 * 0.1, abs=1e-6)
    assert upper_bound(np.array([]), 0.05) == float("inf")


def test_rule_boundaries_level_zero_is_refused_and_one_block_is_allowed():
    """level 0 is refused with its message; max_blocks 1 is a valid budget with one (uncorrected-for) look."""
    with pytest.raises(ValueError, match="level 0.0 is not allowed: need 0 < level < 1"):
        RaceRule(level=0.0)
    one = RaceRule(level=0.95, max_blocks=1)
    assert one.looks() == 1 and one.test_alpha(3) == pytest.approx(0.05 / 2)
    assert RaceRule(max_blocks=FIRST_LOOK).looks() == 1


def test_one_rival_tests_at_the_level_over_the_looks_only():
    """Plain and one arm: a single rival, so each test runs at (1 - level) / looks."""
    rule = RaceRule(level=0.95, max_blocks=12)
    assert rule.test_alpha(2) == pytest.approx(0.05 / 9)
    assert rule.test_alpha(1) == pytest.approx(0.05 / 9)
