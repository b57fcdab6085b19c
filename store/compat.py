"""What stored results predate: config keys and Parquet columns added later, at the values that reproduce them.

A key added to the config after results were stored is left out of the config hash at the value that
reproduces the old behaviour, so a job that measures what it measured before keeps its identity (and its
finished file); a column added to a stage's schema is filled with the value it had then, so old and new
files pool. Every such addition is listed here and nowhere else.
"""
from __future__ import annotations

import pandas as pd

HASH_NEUTRAL = {"stage.peer_modes": ["matched"], "stage.context_extra": [0], "stage.prefill": False,
                "stage.drafters": [], "stage.drafter_ks": [], "stage.recommended": False,
                "stage.k_policies": [], "prompts.skip_per_kind": 0,
                "k_policy.estimator": "iid", "stage.block_timing_repeats": 0,
                "stage.best_fixed": False, "stage.policy_drafters": [], "k_policy.condition_on": "none",
                "k_policy.free_k_min": None}
# Neutral only for these stages: the speed stage's k_policies existed (and was hashed) before.
NEUTRAL_ONLY_FOR = {"stage.k_policies": ("acceptance",)}

# Keys of the cost-model schema that enter the hash of a job running a cost-model arm from that schema
# (pipeline/job_inputs.py), left out at the value of the older behaviour. The schema's earlier keys were
# not hashed when the stored results were written; every key added since is listed here.
ARM_POLICY_KEYS = {"free_k_min": None}

# Columns added to a stage's schema after results were already stored, with the value they had then.
LATER_COLUMNS = {"drafter": "model", "k_policy": "fixed", "context_mode": "prompt", "top_p": 1.0, "top_k": 0}


def hash_neutral(key: str, value: object, stage: str) -> bool:
    """Whether ``key`` at ``value`` stays out of a ``stage`` job's hash (its value before the key existed)."""
    return key in HASH_NEUTRAL and value == HASH_NEUTRAL[key] and stage in NEUTRAL_ONLY_FOR.get(key, (stage,))


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """Fill columns that older result files lack, so old and new runs pool correctly."""
    for col, value in LATER_COLUMNS.items():
        if col not in df:
            df[col] = value
        else:
            df[col] = df[col].fillna(value)
    if "drafter" in df and "arm" in df:
        df.loc[df.arm == "plain", ["drafter", "k_policy"]] = "none"
    return df
