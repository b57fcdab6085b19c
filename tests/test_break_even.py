"""The load at which speculation stops paying (speclab/stats/break_even.py), on gains whose crossing is known."""
import numpy as np
import pytest

from speclab.stats.break_even import break_even, crossing

LOADS = [1, 2, 4, 8]


def test_the_crossing_is_interpolated_in_log_gain_against_log_load():
    # log 1.2 = 0.182 and log 0.9 = -0.105: 0.634 of the way from 2 to 4 in log load
    assert crossing(np.array(LOADS), np.array([1.5, 1.2, 0.9, 0.7])) == pytest.approx(2 * 2 ** 0.6338, rel=1e-3)
    assert crossing(np.array(LOADS), np.array([1.5, 1.2, 1.1, 1.05])) == np.inf
    assert crossing(np.array(LOADS), np.array([0.9, 1.2, 1.1, 1.05])) == 0.0
    assert crossing(np.array(LOADS), np.array([1.5, 1.0, 0.8, 0.7])) == pytest.approx(2.0)  # at 1 counts as crossed


def _blocks(medians, noise, n=9, seed=0):
    rng = np.random.default_rng(seed)
    return {c: m * np.exp(noise * rng.standard_normal(n)) for c, m in zip(LOADS, medians)}


def test_a_clear_crossing_has_a_closed_interval_around_it_and_a_noisy_one_an_open_one():
    clear = break_even(_blocks([1.5, 1.2, 0.9, 0.7], 0.01))
    assert clear.load == pytest.approx(3.1, abs=0.2) and clear.lo < clear.load < clear.hi
    assert not clear.lo_open and not clear.hi_open and clear.hi - clear.lo < 1.0
    assert clear.text().startswith("breaks even at 3.1 concurrent requests (95% ")
    noisy = break_even(_blocks([1.5, 1.2, 0.9, 0.7], 0.5))
    assert noisy.hi - noisy.lo > 10 * (clear.hi - clear.lo)
    # gains close to 1 at every load: resamples that never cross, and some below 1 at once: open at both ends
    flat = break_even(_blocks([1.05, 1.04, 1.03, 1.02], 0.1))
    assert flat.lo_open and flat.hi_open and (flat.lo, flat.hi) == (1.0, 8.0)
    assert flat.text().endswith("(95% <= 1.0 to >= 8.0)")


def test_gains_that_never_cross_say_so_and_bad_input_is_one_line():
    still = break_even(_blocks([1.5, 1.4, 1.3, 1.2], 0.01))
    assert still.load == np.inf and still.text() == "still gains at 8 concurrent requests, the largest load measured"
    lost = break_even(_blocks([0.8, 0.7, 0.6, 0.5], 0.01))
    assert lost.load == 0 and lost.text().startswith("no gain already at 1 concurrent request(s)")
    with pytest.raises(ValueError, match="two loads or more"):
        break_even({1: np.array([1.2])})
    with pytest.raises(ValueError, match="level 1.5 is not allowed"):
        break_even(_blocks([1.5, 1.2, 0.9, 0.7], 0.01), level=1.5)


def test_the_interval_holds_its_level_on_simulated_loads():
    """6 blocks a load (the load stage's 6 rounds) and 9, noise 5% and 15% a block: the 95% interval covers the true
    crossing (3.10) at least 90% of the time over 100 samples (measured 95% at 6 blocks over 200 with 300 resamples
    each, 96.5% at 9 over 200 with 500)."""
    true = crossing(np.array(LOADS), np.array([1.5, 1.2, 0.9, 0.7]))
    for blocks, noise in ((6, 0.05), (6, 0.15), (9, 0.15)):
        covered = [break_even(_blocks([1.5, 1.2, 0.9, 0.7], noise, n=blocks, seed=s + 1), samples=300, seed=s)
                   for s in range(100)]
        assert np.mean([b.lo <= true <= b.hi for b in covered]) >= 0.9, (blocks, noise)
