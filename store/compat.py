"""What stored results predate: Parquet columns added later, at the values that reproduce them.

A column added to a stage's schema is filled with the value it had then, so old and new files pool. Every
such addition is listed here and nowhere else. (A config key added later declares, on its schema field, the
value at which it stays out of a job's hash: pipeline/config/schema.py.)
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

# Columns added to a stage's schema after results were already stored, with the value they had then. A file
# lacking some of them (and nothing else) is complete for its config hash: ``complete_table`` adds them.
#   drafter "model", k_policy "fixed", context_mode "prompt": the only drafter, policy and context of the time
#     (``with_defaults`` also names plain decoding's drafter and policy "none");
#   top_p 1.0, top_k 0: no nucleus or top-k filter (acceptance files of `reference` before sampling knobs);
#   with_prompt / merged_prefill False: every loop before merge_prefill prefilled the prompt apart;
#   tree_nodes 0, draft_call_width 1: every run before tree arms (stage.trees) was a chain, whose draft calls after
#     the first are one-token steps;
#   trust "unchecked", trust_detail "": speed, batch and timing files written before the job-time checks
#     (pipeline/jobs/trust.py) were not checked;
#   engine "speclab": every file before llama.cpp (engine=llama_cpp) was run by speclab's own loop;
#   stopped_by "rounds": every speed file before racing (stage.race, stage.precision) ran all its rounds;
#   None (null, NaN in pandas): not measured by the code of the time, so no value stands in for it:
#     acceptance's per-iteration context and timings (prompt_len ... wall_s: 6 of the 9 `reference` acceptance
#     files), speed's block step times (16 `reference` and 2 `timemodel` files, written before
#     stage.block_timing_repeats), a plan's worst_ratio and chosen_by (one plan each of `timemodel` and
#     `timemodel2`, written before the robust choice), timing's model sizes (target_/draft_ params, bytes,
#     layers: every timing file before issue 21), speed's counts by depth and by pass width (checked_by_depth,
#     accepted_by_depth, draft_calls_by_width, passes_by_width, loop_new_tokens: every speed file before tree arms),
#     a plan's interval for an unseen prompt and its kinds' held-out gains (unseen_lo, unseen_hi, unseen_coverage,
#     cv_gain, cv_error: every plan before issue 38), a plan's reason for its sample's size and its margin over the
#     runner-up (sample_stop: 'sample as chosen'; runner_up_margin: every plan before its sample grew).
#     The readers test these for NaN.
NOT_MEASURED = None
LATER_COLUMNS = {"tree_nodes": 0.0, "draft_call_width": 1.0, **dict.fromkeys(["checked_by_depth", "accepted_by_depth", "draft_calls_by_width",
                                                      "passes_by_width", "loop_new_tokens"], NOT_MEASURED),
                 "drafter": "model", "k_policy": "fixed", "context_mode": "prompt", "top_p": 1.0, "top_k": 0,
                 "with_prompt": False, "merged_prefill": False, "replayed": False, "replay_agrees": NOT_MEASURED,
                 "trust": "unchecked", "trust_detail": "", "engine": "speclab", "stopped_by": "rounds",
                 "sample_stop": "sample as chosen (written before stage.sample_precision)",
                 **dict.fromkeys(["prompt_len", "length", "draft_fed", "draft_calls", "draft_s", "verify_s",
                                  "rollback_s", "total_s", "prefill_s", "wall_s", "block_target_step_s",
                                  "block_draft_step_s", "worst_ratio", "chosen_by", "target_params", "target_bytes",
                                  "target_layers", "draft_params", "draft_bytes", "draft_layers", "unseen_lo", "unseen_hi",
                                  "unseen_coverage", "cv_gain", "cv_error", "runner_up_margin"], NOT_MEASURED)}


# Loop facts of one stage's rows: filled in that stage's older files, never added to other tables.
FILLED_WHERE_PRESENT = {"with_prompt", "merged_prefill", "replayed"}


def later_missing(found: pa.Schema, schema: pa.Schema) -> list[str] | None:
    """The columns of ``schema`` a file with columns ``found`` lacks, when all were added later
    (``LATER_COLUMNS``) and the rest are ``schema``'s in its order and types; None when it is another schema."""
    missing = [name for name in schema.names if name not in found.names]
    kept = pa.schema([f for f in schema if f.name in found.names])
    return missing if kept == found and all(name in LATER_COLUMNS for name in missing) else None


def complete_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (a file with ``later_missing`` columns) with those columns at their ``LATER_COLUMNS`` value."""
    columns = [table.column(f.name) if f.name in table.column_names
               else pa.array([LATER_COLUMNS[f.name]] * table.num_rows, type=f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema.with_metadata(table.schema.metadata))


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """Fill columns that older result files lack, so old and new runs pool correctly (a column not measured
    then stays absent, or NaN where other files have it)."""
    for col, value in LATER_COLUMNS.items():
        if value is NOT_MEASURED:
            continue
        if col in FILLED_WHERE_PRESENT and col not in df:  # their readers treat absence as the old value
            continue
        if col not in df:
            df[col] = value
        else:
            df[col] = df[col].fillna(value)
    if "drafter" in df and "arm" in df:
        df.loc[df.arm == "plain", ["drafter", "k_policy"]] = "none"
    return df
