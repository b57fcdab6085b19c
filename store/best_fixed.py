"""Which single fixed configuration the plan's exploratory check measured as the fastest.

The exploratory check (``+sweep=check_plan``) runs the recommended arm beside every fixed
configuration and picks the best one after the fact, which favours it (the winner of many noisy
arms) and puts it far from the recommended arm in each block. The confirmatory check
(``+sweep=confirm_plan``) names that configuration before it runs and places it next to the
recommended arm. Both the speed stage (to name it) and the analysis (to report it) use this rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from store.layout import stage_paths

BLOCK = ["config_hash", "round", "block"]


@dataclass(frozen=True)
class BestFixed:
    drafter: str
    k: int
    speedup: float   # pooled median ratio to the block's plain run in the exploratory check
    configs: int     # fixed configurations it was picked from
    blocks: int      # blocks it was picked over


def fixed_rows(speed: pd.DataFrame) -> pd.Series:
    return (speed.arm == "speculative") & (speed.k_policy == "fixed")


def exploratory_blocks(speed: pd.DataFrame) -> pd.DataFrame:
    """Rows of the jobs that ran the recommended arm beside two or more fixed configurations."""
    jobs = speed[speed.arm == "recommended"].config_hash.unique()
    fixed = speed[fixed_rows(speed) & speed.config_hash.isin(jobs)]
    many = fixed.groupby("config_hash")[["drafter", "k"]].apply(lambda g: len(g.drop_duplicates()))
    return speed[speed.config_hash.isin(many[many >= 2].index)]


def best_fixed(speed: pd.DataFrame) -> BestFixed | None:
    """The fixed configuration with the highest pooled median speed-up over the exploratory checks'
    blocks (ties: lower k, then drafter name), or None when the rows hold no exploratory check."""
    rows = exploratory_blocks(speed)
    fixed = rows[fixed_rows(rows)]
    if fixed.empty:
        return None
    med = fixed.groupby(["drafter", "k"]).ratio_to_adjacent_plain.median().rename("speedup").reset_index()
    top = med.sort_values(["speedup", "k", "drafter"], ascending=[False, True, True]).iloc[0]
    return BestFixed(str(top.drafter), int(top.k), float(top.speedup), len(med),
                     len(rows[BLOCK].drop_duplicates()))


def find_best_fixed(outputs_dir: str | Path, campaign: str, pair: str) -> BestFixed | None:
    """The best fixed configuration of ``pair``'s exploratory checks in ``campaign``, if any."""
    files = stage_paths(outputs_dir, campaign, "speed", pair)
    speed = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()
    return best_fixed(speed) if not speed.empty else None
