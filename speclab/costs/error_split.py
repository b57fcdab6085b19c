"""A plan's error on prompts it did not see, split in two. The plan predicts a kind's speed-up from its sample's
acceptance priced by its time model; on an unseen prompt, the same model prices that prompt's own acceptance
(its acceptance runs, replayed) and the check measures its speed-up in adjacent runs:

- **sample error** = priced on the unseen prompts - predicted from the sample: the sample's acceptance was not the
  kind's (the prompts differ), though the pricing is the plan's;
- **model error** = measured - priced on the unseen prompts: the same acceptance, priced wrong (pass costs, loop
  overheads, prefill, context growth), or the measurement's own noise.

The two add up to measured - predicted (medians over the kind's checked prompts); the model error's range over
the prompts is paired (each prompt's price beside its own measurement). Pure pandas: no model runs here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from speclab.costs.planning import CONFIG_KEYS

COLUMNS = ["kind", *CONFIG_KEYS, "predicted", "priced_unseen", "measured", "prompts", "sample_error", "model_error",
           "model_error_lo", "model_error_hi"]


def split(predicted: pd.DataFrame, priced: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Per kind and configuration of ``predicted`` (the plan's rows: kind, drafter, k_policy, k, predicted):
    ``priced`` (``speclab.costs.planning.price_runs`` on unseen prompts: prompt_id, kind, configuration, predicted)
    and ``measured`` (prompt_id, kind, configuration, measured: a prompt's median speed-up over its adjacent plain
    runs), both on the same unseen prompts. ``model_error_lo``/``_hi``: the range of the paired per-prompt model errors."""
    keys = ["prompt_id", "kind", *CONFIG_KEYS]
    both = measured[keys + ["measured"]].merge(priced[keys + ["predicted"]].rename(columns={"predicted": "priced"}),
                                               on=keys)
    rows = []
    for r in predicted.itertuples():
        at = both[(both.kind == r.kind) & (both.drafter == r.drafter) & (both.k_policy == r.k_policy)
                  & (both.k == int(r.k))]
        errors = (at.measured - at.priced).to_numpy(float)
        priced_unseen = float(at.priced.median()) if len(at) else np.nan
        measured_kind = float(at.measured.median()) if len(at) else np.nan
        rows.append({"kind": r.kind, "drafter": r.drafter, "k_policy": r.k_policy, "k": int(r.k),
                     "predicted": float(r.predicted), "priced_unseen": priced_unseen, "measured": measured_kind,
                     "prompts": len(at), "sample_error": priced_unseen - float(r.predicted),
                     "model_error": measured_kind - priced_unseen,
                     "model_error_lo": float(errors.min()) if len(errors) else np.nan,
                     "model_error_hi": float(errors.max()) if len(errors) else np.nan})
    return pd.DataFrame(rows, columns=COLUMNS)
