"""The planner's per-kind rule (speclab.costs.kind_rule), fully held out, on simulated kinds with known true
speed-ups: each candidate rule's power, false-override rate and expected regret at the plan's sample sizes.

    python -m benchmarks.plan_rule_simulation [--reps 400]   # a table per scenario, rule and prompts a kind

Two kinds (X and Y) of n prompts each; per prompt a factor shared by every configuration (its acceptance: 20% log
spread) and a noise per configuration. Configuration A is good on both kinds (the robust choice); seven others:
- ``wide``: B 30% faster than A on X, slow on Y (5% noise): a kind-specific winner far beyond the noise;
- ``one sd``: B 15% faster than A on X, slow on Y, at 15% noise (one noise SD);
- ``tie``: C 1% faster than A on X (5% noise): either will do;
- ``none``: A best on both kinds by 5% (10% noise): every override is false.
Regret: 1 - the chosen configuration's true speed-up over the kind's true best, on X. ``RULE`` in
speclab/costs/kind_rule.py is the rule with the least mean regret over the scenarios at 2, 3, 4 and 8 prompts; the
main() table shows it. tests/test_plan_per_kind.py asserts its power and regret on the same simulation.
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from speclab.costs.kind_rule import RULE, RULES, best_column, held_out

CONFIGS = ["A", "B", "C", "D", "E", "F", "G", "H"]
FILLER = 0.92  # the five other configurations, relative to A
SCENARIOS = {  # name: (true speed-ups on X, on Y, per-configuration noise)
    "wide": ({"A": 1.30, "B": 1.69, "C": 1.25}, {"A": 1.30, "B": 0.90, "C": 1.25}, 0.05),
    "one sd": ({"A": 1.30, "B": 1.495, "C": 1.25}, {"A": 1.30, "B": 0.90, "C": 1.25}, 0.15),
    "tie": ({"A": 1.30, "B": 0.90, "C": 1.313}, {"A": 1.30, "B": 0.90, "C": 1.25}, 0.05),
    "none": ({"A": 1.30, "B": 1.235, "C": 1.235}, {"A": 1.30, "B": 1.235, "C": 1.235}, 0.10),
}
SIZES = (2, 3, 4, 8)


def truth(scenario: str) -> np.ndarray:
    """True speed-ups: row 0 kind X, row 1 kind Y; a column per configuration."""
    x, y, _ = SCENARIOS[scenario]
    return np.array([[m.get(c, FILLER * m["A"]) for c in CONFIGS] for m in (x, y)])


def sample(rng: np.random.Generator, scenario: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n prompts of each kind: their predicted speed-ups (rows) per configuration, and which rows are kind X."""
    true, noise = truth(scenario), SCENARIOS[scenario][2]
    rows = np.repeat(true, n, axis=0)
    values = rows * rng.lognormal(0, 0.2, (2 * n, 1)) * rng.lognormal(0, noise, rows.shape)
    return values, np.arange(2 * n) < n


def choose(values: np.ndarray, in_x: np.ndarray, rule: str, level: float = 0.9) -> int:
    """The configuration the rule recommends for kind X (the kind's best median or the robust one)."""
    from speclab.costs.kind_rule import robust_column

    own, robust = best_column(values[in_x]), robust_column(values)
    return own if own != robust and held_out(values, in_x, level, rule).beyond else robust


def rates(scenario: str, n: int, rule: str, reps: int = 400, seed: int = 0) -> dict[str, float]:
    """Over ``reps`` samples: the share that took a configuration other than A for X, and the mean regret on X."""
    rng = np.random.default_rng([seed, n, list(SCENARIOS).index(scenario)])
    true_x = truth(scenario)[0]
    picks = np.array([choose(*sample(rng, scenario, n), rule) for _ in range(reps)])
    return {"override": float(np.mean(picks != 0)), "regret": float(np.mean(1 - true_x[picks] / true_x.max()))}


def table(reps: int = 400) -> pd.DataFrame:
    return pd.DataFrame([{"scenario": s, "prompts": n, "rule": r, **rates(s, n, r, reps)}
                         for s in SCENARIOS for n in SIZES for r in RULES])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    t = table(ap.parse_args().reps)
    pd.set_option("display.width", 160)
    print(t.pivot_table(index=["scenario", "prompts"], columns="rule", values=["override", "regret"]).round(3))
    mean = t.groupby("rule").regret.mean().sort_values()
    print("\nmean regret over scenarios and sizes:\n" + mean.round(4).to_string())
    print(f"\nspeclab.costs.kind_rule.RULE = {RULE!r}; least regret here: {mean.index[0]!r}")


if __name__ == "__main__":
    main()
