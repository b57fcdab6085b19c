"""The llama.cpp plan: the engine's costs from its timing rows, each request priced, the choice per kind as flags."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.stages.plan import choice_text
from speclab.engine_plan import engine_costs, predict_requests
from speclab.planning import recommend


def timing_rows(t_step=0.010, d_step=0.004, flat=0.002):
    rows = []
    for ctx_len in (20, 68):  # a longer context's passes cost more: the plan prices the prompt's own
        extra = 0.0 if ctx_len == 20 else 0.005
        for m in range(1, 10):
            rows.append({"prompt_id": "p", "context_len": ctx_len, "model": "target", "pass_len": m,
                         "median_s": t_step + flat * (m - 1) + extra})
        rows.append({"prompt_id": "p", "context_len": ctx_len, "model": "draft", "pass_len": 1,
                     "median_s": d_step + extra})
    return pd.DataFrame(rows)


def test_costs_are_the_prompts_own_context_medians():
    c = engine_costs(timing_rows())
    assert c.target_step_s == pytest.approx(0.010)
    assert c.draft_step_s == pytest.approx(0.004)
    assert c.verify.time(5) == pytest.approx(0.018)


def request(drafter, k, policy, accepted, drafted, n=48, prefill=0.0, kind="code", pid="a"):
    return {"prompt_id": pid, "kind": kind, "drafter": drafter, "k": k, "k_policy": policy, "new_tokens": n,
            "proposed": drafted, "accepted": accepted, "prefill_s": prefill}


def test_a_request_is_priced_by_passes_drafts_and_checks_with_the_prompt_on_both_sides():
    costs = engine_costs(timing_rows())
    # 48 tokens, 40 drafted, 36 accepted: 12 passes of 40/12 drafts; each pass: d * 4 ms + t_V(d + 1) ms
    d = 40 / 12
    spec = 12 * (d * 0.004 + 0.010 + 0.002 * d)
    plain = 48 * 0.010
    got = predict_requests(costs, pd.DataFrame([request("model", 4, "fixed", 36, 40, prefill=0.1)]))
    # the draft model also reads the prompt: its prefill is priced at the draft/target step ratio
    assert got.predicted[0] == pytest.approx((plain + 0.1) / (spec + 0.1 * (1 + 0.4)))
    lookup = predict_requests(costs, pd.DataFrame([request("ngram-simple", 0, "library_default", 36, 40)]))
    assert lookup.predicted[0] == pytest.approx(plain / (12 * (0.010 + 0.002 * d)))  # no draft model: drafts free


def test_the_plan_recommends_no_speculation_where_every_candidate_loses_and_says_the_flags_otherwise():
    costs = engine_costs(timing_rows(d_step=0.012))  # a draft step dearer than the target's: drafting loses
    reqs = [request("model", 4, "fixed", a, 40, kind=kind, pid=f"{kind}{i}")
            for kind, a in (("prose", 8), ("code", 10)) for i in range(3)]
    reqs += [request("ngram-simple", 0, "library_default", 30, 32, kind="code", pid=f"code{i}") for i in range(3)]
    reqs += [request("ngram-simple", 0, "library_default", 0, 0, kind="prose", pid=f"prose{i}") for i in range(3)]
    rec = recommend(predict_requests(costs, pd.DataFrame(reqs)), samples=200, level=0.9).assign(engine="llama_cpp")
    chosen = {r.kind: r for r in rec[rec.recommended].itertuples()}
    assert chosen["code"].drafter == "ngram-simple"
    assert choice_text(chosen["code"]) == "--spec-type ngram-simple"
    assert choice_text(chosen["prose"]) in ("plain decoding (no speculation)", "--spec-type ngram-simple")
    assert all(r.drafter != "model" for r in chosen.values())
