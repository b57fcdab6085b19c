"""How noisy is one measured speed-up on this machine, and does a plan's timing part say so? Per speed job of every
campaign: the spread, across the job's rounds, of one prompt's log speed-up over its adjacent plain run (the
standard deviation per prompt and configuration, its median over them); per timing job: the noise a plan states
from it (speclab.costs.planning.run_noise: one target pass's spread over its repeats, times sqrt 2), which widens
the plan's interval for an unseen prompt.

    python -m benchmarks.run_noise

Writes outputs/benchmarks/run_noise.parquet (a row per job) and prints the two distributions. No model runs here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from speclab.costs.planning import run_noise

CAMPAIGNS = Path("outputs/campaigns")
OUT = Path("outputs/benchmarks")
CONFIG = ["prompt_id", "arm", "drafter", "k", "k_policy"]


def round_spread(speed: pd.DataFrame) -> float:
    """The median over prompts and configurations run in at least two rounds of the SD of their log speed-ups."""
    spec = speed[(speed.arm != "plain") & (speed.ratio_to_adjacent_plain > 0)]
    logs = np.log(spec.ratio_to_adjacent_plain).groupby([spec[c] for c in CONFIG]).std().dropna()
    return float(logs.median()) if len(logs) else float("nan")


def jobs() -> pd.DataFrame:
    rows = []
    for stage, measure in (("speed", round_spread), ("timing", run_noise)):
        for f in sorted(CAMPAIGNS.glob(f"*/{stage}/*.parquet")):
            df = pd.read_parquet(f)
            rows.append({"campaign": f.parts[-3], "job": f.stem, "stage": stage,
                         "engine": str(df.engine.iloc[0]) if "engine" in df and len(df) else "speclab",
                         "noise": measure(df)})
    return pd.DataFrame(rows)


def main() -> None:
    table = jobs()
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_parquet(OUT / "run_noise.parquet", index=False)
    for stage, what in (("speed", "measured: a prompt's log speed-up across rounds, SD"),
                        ("timing", "stated by a plan's timing part (run_noise)")):
        v = table[table.stage == stage].noise.dropna()
        print(f"{what}: {len(v)} jobs, median {v.median():.3f}, 10-90% {v.quantile(0.1):.3f}-{v.quantile(0.9):.3f}, "
              f"range {v.min():.3f}-{v.max():.3f}")
    print(f"written to {OUT / 'run_noise.parquet'}")


if __name__ == "__main__":
    main()
