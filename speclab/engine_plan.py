"""Plan an engine's speculative settings from its own timings and per-request counters (llama.cpp's server).

The engine's costs come from its timing rows (the target's pass over m new tokens at the prompt's context, the
draft's one-token step); each acceptance request (one configuration on one prompt: new tokens, drafted,
accepted, the server's prompt time) is priced by ``speclab.engine_time.predict`` and its prompt time added on
both sides (with a draft model, the draft also reads the prompt: priced at the draft/target step ratio). The
per-request predictions then go to ``speclab.planning.recommend``, which picks per kind as for speclab's loop
(robust choice, sign test, plain decoding as a candidate at exactly 1).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from speclab.engine_time import Counters, EngineCosts, predict, with_prompt

# drafter columns whose proposals come from a draft model (llama.cpp's draft-simple is "model")
MODEL_DRAFTERS = ("model",)


def engine_costs(timing: pd.DataFrame) -> EngineCosts:
    """Median pass times at the prompt's own context (the shortest context timed) of target and draft."""
    at = timing[timing.context_len == timing.groupby("prompt_id").context_len.transform("min")]
    target = at[at.model == "target"].groupby("pass_len").median_s.median()
    draft = at[at.model == "draft"].groupby("pass_len").median_s.median()
    if 1 not in target.index:
        raise ValueError("the engine's timing rows lack the target's one-token pass (pass_len 1)")
    return EngineCosts.from_timings(float(target[1]), float(draft.get(1, np.nan)),
                                    {float(m): float(s) for m, s in target.items()})


def predict_requests(costs: EngineCosts, acc: pd.DataFrame) -> pd.DataFrame:
    """Per acceptance request: the predicted speed-up over plain decoding (prompt time included), its alpha."""
    rows = []
    ratio = costs.draft_step_s / costs.target_step_s if costs.draft_step_s == costs.draft_step_s else 0.0
    for r in acc.itertuples():
        uses_model = r.drafter in MODEL_DRAFTERS
        c = costs if uses_model else costs.without_draft()
        prompt = float(r.prefill_s) if r.prefill_s == r.prefill_s else 0.0
        p = with_prompt(predict(c, Counters(float(r.new_tokens), float(r.proposed), float(r.accepted))), prompt,
                        prompt * ratio if uses_model else 0.0)
        rows.append({"prompt_id": r.prompt_id, "kind": r.kind, "drafter": r.drafter, "k_policy": r.k_policy,
                     "k": int(r.k), "predicted": p.speedup, "predicted_iid": np.nan,
                     "alpha": r.accepted / r.proposed if r.proposed else np.nan})
    return pd.DataFrame(rows)
