"""The plan's sample rule (speclab.costs.sample_rule) on simulated kinds with a known best configuration: how often
a kind is settled on a configuration more than the precision below the true best (the rule's error; stated: at most
1 - level), and how often it settles at all, beside the rule it replaced (the sample's runner-up only, no correction).

    python -m benchmarks.plan_sample_simulation [--reps 1000]   # writes outputs/benchmarks/plan_sample_rule.parquet

m configurations: one ``gap`` faster than m - 1 equal ones; n prompts, each with a factor shared by every
configuration (20% log spread) and a noise per configuration; the recommendation is the highest median (the
kind's own best, chosen after the fact), precision 5%, level 0.9. ``grown``: the sample grows from 2 prompts to 8, one
at a time, and stops at the first size that settles (the rule corrected for those 7 looks).
tests/test_plan_sample_rule.py asserts the error at 2, 4 and 8 prompts on the same simulation.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from speclab.costs.sample_rule import closest_rival, is_settled, looks

PRECISION, LEVEL = 0.05, 0.9
CONFIGS, GAPS, NOISES, SIZES = (5, 10, 20), (0.07, 0.10), (0.02, 0.05, 0.10), (2, 4, 8)
GROWN = "grown"
OUT = Path("outputs/benchmarks/plan_sample_rule.parquet")


def sample(rng: np.random.Generator, m: int, gap: float, noise: float, n: int) -> np.ndarray:
    """n prompts' predicted speed-ups (rows) of m configurations; column 0 is the true best."""
    mu = np.zeros(m)
    mu[0] = np.log1p(gap)
    return np.exp(mu + rng.normal(0, 0.2, (n, 1)) + rng.normal(0, noise, (n, m)))


def old_settled(values: np.ndarray, at: int) -> bool:
    """The replaced rule: the recommendation against the sample's runner-up (the highest other median), at 1 - level."""
    med = np.median(values, axis=0)
    med[at] = -np.inf
    d = np.log(values[:, at] / values[:, int(np.argmax(med))])
    return bool(d.mean() - student_t.ppf(LEVEL, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)) >= np.log(1 - PRECISION))


def settles(values: np.ndarray, rule: str, n_looks: int = 1) -> tuple[bool, int]:
    """Whether the rule settles on these prompts, and on which configuration (the highest median)."""
    at = int(np.argmax(np.median(values, axis=0)))
    if rule == "old":
        return old_settled(values, at), at
    return is_settled(closest_rival(values, at, LEVEL, n_looks), PRECISION), at


def outcome(rng: np.random.Generator, m: int, gap: float, noise: float, n: int | str, rule: str) -> tuple[bool, bool]:
    """One simulated kind: (settled, settled more than the precision below the true best)."""
    miss = lambda at: at != 0 and gap > PRECISION / (1 - PRECISION)  # noqa: E731  (the others are 1/(1+gap) of it)
    if n != GROWN:
        ok, at = settles(sample(rng, m, gap, noise, n), rule)
        return ok, ok and miss(at)
    values = sample(rng, m, gap, noise, SIZES[-1])
    for size in range(2, SIZES[-1] + 1):
        ok, at = settles(values[:size], rule, looks(2, SIZES[-1]))
        if ok:
            return True, miss(at)
    return False, False


def rates(m: int, gap: float, noise: float, n: int | str, rule: str, reps: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng([seed, m, int(1000 * gap), int(1000 * noise), 0 if n == GROWN else n,
                                 rule == "old"])
    got = np.array([outcome(rng, m, gap, noise, n, rule) for _ in range(reps)])
    return {"settled": float(got[:, 0].mean()), "error": float(got[:, 1].mean()), "reps": reps}


def table(reps: int) -> pd.DataFrame:
    return pd.DataFrame([{"configs": m, "gap": g, "noise": s, "prompts": str(n), "rule": r,
                          **rates(m, g, s, n, r, reps)}
                         for m, g, s, n, r in itertools.product(CONFIGS, GAPS, NOISES, (*SIZES, GROWN), ("new", "old"))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    t = table(ap.parse_args().reps).assign(level=LEVEL, precision=PRECISION)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    t.to_parquet(OUT)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 200)
    print(t.pivot_table(index=["configs", "gap", "noise"], columns=["rule", "prompts"], values="error").round(3))
    worst = t.groupby("rule").error.max()
    print(f"\nworst error (stated {1 - LEVEL:.2f}): new {worst['new']:.3f}, old {worst['old']:.3f}")
    print(t.pivot_table(index=["configs", "noise"], columns=["rule", "prompts"], values="settled").round(2))
    print(f"written {OUT}")


if __name__ == "__main__":
    main()
