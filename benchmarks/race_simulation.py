"""The race's error rate over repeated looks, simulated: blocks of adjacent runs of plain decoding and six arms
(two within 0.5-1% of the best) under log-normal, drifting and heavy-tailed noise, looked at after every block by
``speclab.stats.racing.look``. Reports, per noise: how often the true best arm is dropped (the race's error; at most
1 - level), how often an interval of a kind stopped for precision misses its arm's true median speed-up, and the
runs the race used out of the budget. ``--uncorrected`` tests every drop at 1 - level (no correction for the looks
and the rivals): its error rate is far above 1 - level. The coverage tests use the same simulator
(tests/test_race_simulation.py).

    python -m benchmarks.race_simulation [--trials 400] [--uncorrected]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from speclab.stats.racing import PRECISION, RaceRule, look
from speclab.stats.intervals import median_ci

PLAIN = "plain"
# True log speed-ups: plain, the best, two rivals within 1-2% of it, and three clear losers.
MEANS = {PLAIN: 0.0, "best": 0.30, "near1": 0.295, "near2": 0.29, "mid": 0.15, "low": 0.05, "slow": -0.15}
BEST = "best"
NOISES = ("lognormal", "drift", "heavy")


def block(noise: str, means: dict[str, float], order: list[str], b: int, rng: np.random.Generator) -> dict[str, float]:
    """One block's log throughputs, each arm's true log speed-up plus its run's noise, in the block's run order."""
    n = len(order)
    if noise == "lognormal":  # a 10% spread per run
        e = rng.normal(0, 0.10, n)
    elif noise == "heavy":  # Student t, 2 degrees of freedom: now and then a run several times off
        e = 0.05 * rng.standard_t(2, n)
    else:  # drift: the machine slows 1% from one run to the next and wanders (random-walk steps of 3%)
        e = rng.normal(0, 0.06, n) - 0.01 * np.arange(n) + np.cumsum(rng.normal(0, 0.03, n))
    return {a: means[a] + e[i] for i, a in enumerate(order)}


@dataclass
class Trial:
    best_dropped: bool
    runs: int
    precision_stops: int
    precision_misses: int


def race(noise: str, rule: RaceRule, rng: np.random.Generator, means: dict[str, float] = MEANS) -> Trial:
    """One race over at most ``rule.max_blocks`` blocks, looking after each."""
    arms, running = list(means), list(means)
    ys: dict[str, list[float]] = {a: [] for a in arms}
    plain_in, runs, best_dropped, stop = True, 0, False, None
    for b in range(rule.max_blocks):
        order = running[b % len(running):] + running[:b % len(running)]
        t = block(noise, means, order, b, rng)
        runs += len(order)
        for a in running:
            ys[a].append(t[a] - t[PLAIN])
        in_race = {a: np.array(ys[a]) for a in running if a != PLAIN or plain_in}
        seen = look(in_race, PLAIN, rule, len(arms))
        for a in seen.dropped:
            if a == PLAIN:
                plain_in = False
            else:
                running.remove(a)
                best_dropped |= a == BEST
        if seen.stop:
            stop = seen.stop
            break
    misses = 0
    if stop == PRECISION:
        for a in running:
            if a != PLAIN:
                lo, hi = median_ci(np.exp(ys[a]), rule.level)
                misses += not lo <= np.exp(means[a]) <= hi
    return Trial(best_dropped, runs, int(stop == PRECISION), misses)


def summary(noise: str, rule: RaceRule, trials: int, rng: np.random.Generator) -> dict[str, float]:
    """Share of races that dropped the best, share of precision-stopped intervals that miss, runs used / budget."""
    out = [race(noise, rule, rng) for _ in range(trials)]
    stops = sum(t.precision_stops for t in out)
    intervals = stops * (len(MEANS) - 1)
    return {"best_dropped": float(np.mean([t.best_dropped for t in out])),
            "precision_miss": float(sum(t.precision_misses for t in out) / intervals) if intervals else float("nan"),
            "precision_stops": stops / trials,
            "runs_share": float(np.mean([t.runs for t in out]) / (rule.max_blocks * len(MEANS)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--uncorrected", action="store_true", help="every drop tested at 1 - level")
    ap.add_argument("--precision", type=float, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(3)
    rule = RaceRule(level=0.95, max_blocks=12, precision=args.precision, corrected=not args.uncorrected)
    for noise in NOISES:
        s = summary(noise, rule, args.trials, rng)
        print(f"{noise}: best dropped {s['best_dropped']:.3f} (level allows {1 - rule.level:.2f}); precision stops "
              f"{s['precision_stops']:.2f}, their intervals missing {s['precision_miss']:.3f}; runs used "
              f"{s['runs_share']:.2f} of the budget")


if __name__ == "__main__":
    main()
