"""The llama.cpp plan: the engine's costs from its timing rows, each request priced, the choice per kind as flags."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.stages.plan import choice_text
from speclab.costs.engine_plan import engine_costs, fit_overheads, predict_requests
from speclab.costs.planning import recommend


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


def request(drafter, k, policy, accepted, drafted, n=48, prefill=0.0, kind="code", pid="a", total=float("nan")):
    return {"prompt_id": pid, "kind": kind, "drafter": drafter, "k": k, "k_policy": policy, "new_tokens": n,
            "proposed": drafted, "accepted": accepted, "prefill_s": prefill, "total_s": total}


def test_a_request_is_priced_by_passes_drafts_and_checks_with_the_prompt_on_both_sides():
    costs = engine_costs(timing_rows())
    # 48 tokens, 40 drafted, 36 accepted: 12 passes of 40/12 drafts; each pass: d * 4 ms + t_V(d + 1) ms
    d = 40 / 12
    spec = 12 * (d * 0.004 + 0.010 + 0.002 * d)
    plain = 48 * 0.010
    got = predict_requests(costs, pd.DataFrame([request("model", 4, "fixed", 36, 40, prefill=0.14)]))
    # the speculative request's prompt time holds the draft reading it too: plain decoding's is the target's share
    assert got.predicted[0] == pytest.approx((plain + 0.14 * 10 / 14) / (spec + 0.14))
    lookup = predict_requests(costs, pd.DataFrame([request("ngram-simple", 0, "library_default", 36, 40)]))
    assert lookup.predicted[0] == pytest.approx(plain / (12 * (0.010 + 0.002 * d)))  # no draft model: drafts free


def test_overheads_the_passes_leave_out_are_fitted_on_the_plans_own_requests_and_priced():
    costs = engine_costs(timing_rows())
    per_pass, per_draft, lookup = 0.020, 0.003, 0.001
    reqs = []
    for i, (acc, drafted) in enumerate([(36, 40), (20, 40), (30, 48), (10, 16), (5, 30)]):
        passes, d = 48 - acc, drafted / (48 - acc)
        timed = passes * (d * 0.004 + 0.010 + 0.002 * d)
        reqs.append(request("model", 4, "fixed", acc, drafted, pid=f"m{i}",
                            total=timed + per_pass * passes + per_draft * drafted))
    for i, (acc, drafted) in enumerate([(10, 12), (0, 0), (20, 30)]):
        passes, d = 48 - acc, drafted / (48 - acc)
        reqs.append(request("ngram-simple", 0, "library_default", acc, drafted, pid=f"n{i}",
                            total=passes * (0.010 + 0.002 * d) + lookup * passes))
    o = fit_overheads(costs, pd.DataFrame(reqs))
    assert (o.model_per_pass, o.model_per_draft, o.lookup_per_pass) == pytest.approx((per_pass, per_draft, lookup))
    got = predict_requests(costs, pd.DataFrame([reqs[0]]), o).predicted[0]
    assert got == pytest.approx(48 * (0.010 + lookup) / reqs[0]["total_s"])  # plain pays the per-token overhead too


def test_the_plan_recommends_no_speculation_where_every_candidate_loses_and_says_the_flags_otherwise():
    costs = engine_costs(timing_rows(d_step=0.012))  # a draft step dearer than the target's: drafting loses
    reqs = [request("model", 4, "fixed", a, 40, kind=kind, pid=f"{kind}{i}")
            for kind, a in (("prose", 8), ("code", 10)) for i in range(3)]
    reqs += [request("ngram-simple", 0, "library_default", 30, 32, kind="code", pid=f"code{i}") for i in range(3)]
    reqs += [request("ngram-simple", 0, "library_default", 0, 0, kind="prose", pid=f"prose{i}") for i in range(3)]
    rec = recommend(predict_requests(costs, pd.DataFrame(reqs)), level=0.9).assign(engine="llama_cpp")
    chosen = {r.kind: r for r in rec[rec.recommended].itertuples()}
    assert chosen["code"].drafter == "ngram-simple"
    assert choice_text(chosen["code"]) == "--spec-type ngram-simple"
    assert choice_text(chosen["prose"]) in ("plain decoding (no speculation)", "--spec-type ngram-simple")
    assert all(r.drafter != "model" for r in chosen.values())


def test_speed_rows_become_requests_with_each_engines_own_accepted_count():
    from speclab.costs.engine_plan import speed_requests
    rows = pd.DataFrame({
        "prompt_id": ["a", "b", "c", "d"], "kind": ["code"] * 4, "drafter": ["model"] * 4, "k": [4] * 4,
        "k_policy": ["fixed"] * 4, "new_tokens": [48, 48, 48, 48], "prefill_s": [0.1] * 4,
        # llama.cpp (passes = n - accepted), vLLM (passes after the prompt's: n - 1 - accepted), a vLLM request that
        # drafted nothing, speclab's loop (its accepted / checked, with checked counted by depth)
        "iterations": [18, 17, 47, 12], "mean_k": [4.0, 4.0, 0.0, 4.0], "acceptance_rate": [0.417, 0.441, float("nan"), 0.9],
        "checked_by_depth": ["", "", "", "12,12,10,6"]})
    req = speed_requests(rows)
    assert req.proposed.tolist() == [72, 68, 0, 48]
    assert req.accepted.tolist() == [30, 30, 0, 36]
    assert (req.accepted <= req.proposed).all()
