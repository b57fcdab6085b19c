"""Plan an engine's speculative settings from its own timings and per-request counters (llama.cpp's server).

The engine's costs come from its timing rows (the target's pass over m new tokens at the prompt's context, the
draft's one-token step); each acceptance request (one configuration on one prompt: new tokens, drafted,
accepted, the server's prompt and decode times) is priced by ``speclab.costs.engine_time.predict``. What those passes do
not hold (sampling every checked position, the draft's catch-up after a rejection, the server's bookkeeping) is
calibrated on the plan's own requests (``fit_overheads``): their decode time is measured, so a least-squares fit
gives a cost per target pass and per drafted token, one for draft models and one for n-gram lookup (whose
per-pass cost stands in for plain decoding's per-token one, the same sampling and bookkeeping). The prompt: a
speculative request's prompt time includes the draft model reading it, so plain decoding's is the target's share
(``prompt_s * t_T / (t_T + t_D)``). The per-request predictions then go to ``speclab.costs.planning.recommend``, which
picks per kind as for speclab's loop (robust choice, sign test, plain decoding as a candidate at exactly 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from speclab.costs.engine_time import Counters, EngineCosts, predict

# drafter columns whose proposals come from a draft model (llama.cpp's draft-simple is "model")
MODEL_DRAFTERS = ("model",)


@dataclass(frozen=True)
class Overheads:
    """Seconds the timed passes leave out: per target pass and per drafted token with a draft model, per pass with
    n-gram lookup (also plain decoding's per token)."""

    model_per_pass: float = 0.0
    model_per_draft: float = 0.0
    lookup_per_pass: float = 0.0


def engine_costs(timing: pd.DataFrame) -> EngineCosts:
    """Median pass times at the prompt's own context (the shortest context timed) of target and draft."""
    at = timing[timing.context_len == timing.groupby("prompt_id").context_len.transform("min")]
    target = at[at.model == "target"].groupby("pass_len").median_s.median()
    draft = at[at.model == "draft"].groupby("pass_len").median_s.median()
    if 1 not in target.index:
        raise ValueError("the engine's timing rows lack the target's one-token pass (pass_len 1)")
    return EngineCosts.from_timings(float(target[1]), float(draft.get(1, np.nan)),
                                    {float(m): float(s) for m, s in target.items()})


def _priced(costs: EngineCosts, r) -> tuple[float, float, float]:
    """(passes, drafted, the timed passes' seconds) of one request."""
    c = costs if r.drafter in MODEL_DRAFTERS else costs.without_draft()
    p = predict(c, Counters(float(r.new_tokens), float(r.proposed), float(r.accepted)))
    return p.passes, float(r.proposed), p.speculative_s


def fit_overheads(costs: EngineCosts, acc: pd.DataFrame) -> Overheads:
    """Least squares (non-negative) of each request's measured decode time (``total_s``) beyond its timed passes,
    on its passes and drafted tokens; zeros where the rows do not say (no decode time, too few requests)."""
    from scipy.optimize import nnls

    rows = [(r.drafter in MODEL_DRAFTERS, *_priced(costs, r), float(r.total_s)) for r in acc.itertuples()
            if r.total_s == r.total_s and r.new_tokens > r.accepted]
    fit = {}
    for model in (True, False):
        got = [(passes, drafted, measured - priced) for m, passes, drafted, priced, measured in rows if m == model]
        if len(got) < 3:
            fit[model] = (0.0, 0.0)
            continue
        a = np.array([[p, d] if model else [p] for p, d, _ in got], float)
        x, _ = nnls(a, np.array([r for _, _, r in got], float))
        fit[model] = (float(x[0]), float(x[1]) if model else 0.0)
    return Overheads(fit[True][0], fit[True][1], fit[False][0])


def predict_requests(costs: EngineCosts, acc: pd.DataFrame, overheads: Overheads = Overheads()) -> pd.DataFrame:
    """Per acceptance request: the predicted speed-up over plain decoding (prompt time included), its alpha."""
    rows = []
    share = costs.target_step_s / (costs.target_step_s + costs.draft_step_s) if costs.draft_step_s > 0 else 1.0
    for r in acc.itertuples():
        uses_model = r.drafter in MODEL_DRAFTERS
        passes, drafted, priced = _priced(costs, r)
        prompt = float(r.prefill_s) if r.prefill_s == r.prefill_s else 0.0
        extra = (overheads.model_per_pass * passes + overheads.model_per_draft * drafted if uses_model
                 else overheads.lookup_per_pass * passes)
        spec = priced + extra + prompt
        plain = float(r.new_tokens) * (costs.target_step_s + overheads.lookup_per_pass) + prompt * (
            share if uses_model else 1.0)
        rows.append({"prompt_id": r.prompt_id, "kind": r.kind, "drafter": r.drafter, "k_policy": r.k_policy,
                     "k": int(r.k), "predicted": plain / spec if passes > 0 and spec > 0 else np.nan,
                     "predicted_iid": np.nan, "alpha": r.accepted / r.proposed if r.proposed else np.nan})
    return pd.DataFrame(rows)


def engine_counts(spec: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Speed rows' drafted (proposals per pass times passes, ``mean_k * iterations``) and accepted as an engine counts
    it (its acceptance_rate, accepted / drafted, times drafted; none drafted: none accepted)."""
    drafted = (spec.mean_k * spec.iterations).round()
    return drafted, (spec.acceptance_rate * drafted).round().where(drafted > 0, 0.0)


def speed_requests(spec: pd.DataFrame) -> pd.DataFrame:
    """Speed rows of speculative arms as requests for ``predict_requests``: drafted = proposals per pass times
    passes (``mean_k * iterations``); accepted = new tokens - passes for speclab's loop (its rows count checked
    proposals by depth: every pass yields one token beyond the accepted), else the engine's own ratio times drafted
    (an engine's passes need not count the prompt's, which made the first token: vLLM's do not); the request's own
    prompt time."""
    drafted, own = engine_counts(spec)
    drafted = drafted.fillna(0.0)
    accepted = (spec.new_tokens - spec.iterations).astype(float)
    if "checked_by_depth" in spec and "acceptance_rate" in spec:
        engine_rows = spec.checked_by_depth.fillna("").astype(str).eq("")
        accepted = accepted.where(~engine_rows, own.fillna(0.0))
    return pd.DataFrame({"prompt_id": spec.prompt_id.values, "kind": spec.kind.values, "drafter": spec.drafter.values,
                         "k": spec.k.values, "k_policy": spec.k_policy.values, "new_tokens": spec.new_tokens.values,
                         "proposed": drafted.values, "accepted": accepted.values,
                         "prefill_s": spec.prefill_s.values}, index=spec.index)
