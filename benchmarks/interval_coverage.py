"""How often a "95%" interval of the median speed-up contains the true median: simulated adjacent-run ratios
(true median 1) under log-normal, drifting and heavy-tailed noise, for the distribution-free interval the report uses
(speclab.stats.intervals.median_ci) and the percentile bootstrap it replaced. The simulator is the coverage tests' own
(tests/test_interval_coverage.py).

    python -m benchmarks.interval_coverage [--trials 300]
"""
from __future__ import annotations

import argparse

import numpy as np

from speclab.stats.intervals import bootstrap_interval, median_ci

RUNS = (2, 3, 4, 6, 8, 12, 30)


def ratios(noise: str, n: int, rng: np.random.Generator, trials: int = 2000) -> np.ndarray:
    """``trials`` x ``n`` ratios to the adjacent plain run whose true median is 1."""
    if noise == "lognormal":  # a 15% spread
        log = rng.normal(0, 0.15, (trials, n))
    elif noise == "heavy":  # Student t, 2 degrees of freedom: now and then a run several times off
        log = 0.08 * rng.standard_t(2, (trials, n))
    else:  # drift: the machine slows steadily (30% over the runs) and wanders (random-walk steps of 5% between
        # two runs); a ratio carries the drift between its arm run and its plain run, whose order a rotated block
        # alternates
        order = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
        gap = 0.3 / (2 * n) + rng.normal(0, 0.05, (trials, n))
        log = rng.normal(0, 0.1, (trials, n)) + order * gap
    return np.exp(log)


def paired_blocks(noise: str, n: int, rng: np.random.Generator, trials: int = 2000,
                  speedups: tuple[float, float] = (1.4, 1.2)) -> np.ndarray:
    """``trials`` x ``n`` per-block differences of two arms' ratios to the block's plain run (arm a - arm b), the
    three runs of each block in a random order: each run's noise, plus, under drift, a machine that slows along the
    block and wanders."""
    if noise == "lognormal":
        e = rng.normal(0, 0.1, (trials, n, 3))
    elif noise == "heavy":
        e = 0.05 * rng.standard_t(2, (trials, n, 3))
    else:
        e = rng.normal(0, 0.05, (trials, n, 3)) + 0.03 * np.arange(3) + np.cumsum(rng.normal(0, 0.03, (trials, n, 3)),
                                                                                  axis=2)
    order = rng.permuted(np.broadcast_to(np.arange(3), (trials, n, 3)), axis=2)  # positions of plain, a, b
    run = np.take_along_axis(e, order, axis=2)
    plain, a, b = run[..., 0], run[..., 1], run[..., 2]
    return speedups[0] * np.exp(a - plain) - speedups[1] * np.exp(b - plain)


def true_paired_median(noise: str, rng: np.random.Generator) -> float:
    """The median of ``paired_blocks``' distribution, from a million blocks."""
    return float(np.median(paired_blocks(noise, 1000, rng, 1000)))


def coverage(noise: str, n: int, trials: int, rng: np.random.Generator, level: float = 0.95) -> tuple[float, float]:
    """(percentile bootstrap, order statistics) coverage at ``n`` runs; NaN where no interval exists."""
    x = ratios(noise, n, rng, trials)
    boot = np.array([bootstrap_interval(r, np.median, level, 1000, i) for i, r in enumerate(x)])
    order = np.array([median_ci(r, level) for r in x])
    covers = lambda ci: float(np.mean((ci[:, 0] <= 1) & (1 <= ci[:, 1]))) if not np.isnan(ci).all() else np.nan  # noqa: E731
    return covers(boot), covers(order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    for noise in ("lognormal", "drift", "heavy"):
        cells = [(n, *coverage(noise, n, args.trials, rng)) for n in RUNS]
        print(f"{noise}: " + "; ".join(f"n={n}: bootstrap {b:.2f} / order statistics {o:.2f}" for n, b, o in cells))


if __name__ == "__main__":
    main()
