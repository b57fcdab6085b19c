"""The Spec-Bench table from speed rows (no model runs): both speed-up definitions per category, the plan's
check on held-out prompts, the dvc metrics, and a campaign without Spec-Bench runs saying so."""
import numpy as np
import pandas as pd
import pytest

from analysis.spec_bench import (category_table, markdown, metrics, recommendation_check, spec_bench_rows)

BOOT = {"samples": 200, "seed": 0, "level": 0.95}


def _speed():
    """Two categories, 3 prompts each; in each block plain, speculative k=4 and the recommended arm (lookup k=2).
    Prompt 'r3' is slow (long RAG): Spec-Bench's ratio of means weighs it, speclab's median of ratios does not."""
    rows = []
    for kind, prompts in (("rag", ["r1", "r2", "r3"]), ("math_reasoning", ["m1", "m2", "m3"])):
        for block, pid in enumerate(prompts):
            base = 2.0 if pid == "r3" else 10.0
            for arm, drafter, k, factor, same in (("plain", "none", 0, 1.0, True), ("speculative", "model", 4, 1.5, True),
                                                  ("recommended", "prompt_lookup", 2, 1.2 if pid != "r3" else 3.0, False)):
                tps = base * factor
                rows.append({"pair": "p", "kind": kind, "prompt_id": pid, "block": block, "arm": arm,
                             "drafter": drafter, "k_policy": "fixed" if k else "none", "k": k, "tokens_per_s": tps,
                             "ratio_to_adjacent_plain": factor, "tokens_per_pass": 1.0 + factor,
                             "acceptance_rate": 0.5, "identical_to_plain": same})
    rows.append({**rows[0], "kind": "prose"})  # not a Spec-Bench category: left out
    return pd.DataFrame(rows)


def test_both_definitions_per_category_and_pooled():
    rows = spec_bench_rows(_speed())
    assert set(rows.kind) == {"rag", "math_reasoning"}
    t = category_table(rows, BOOT).set_index(["category", "config"])
    rag = t.loc[("rag", "recommended prompt_lookup k=2")]
    # speclab: median of (1.2, 1.2, 3.0); Spec-Bench: mean tps (12 + 12 + 6) / 3 over mean plain (10 + 10 + 2) / 3
    assert rag.speedup_speclab == pytest.approx(1.2)
    assert rag.speedup_spec_bench == pytest.approx(30 / 22)
    assert rag.identical_share == 0 and rag.prompts == 3
    assert t.loc[("all", "speculative model k=4")].runs == 6
    assert t.loc[("rag", "plain")].tokens_per_pass == 1.0 and np.isnan(t.loc[("rag", "plain")].alpha)
    m = metrics(t.reset_index())
    assert m["p"]["math_reasoning"]["best_config"] == "speculative model k=4"
    assert m["p"]["rag"]["best_speedup_speclab"] == pytest.approx(1.5)


def test_the_recommendation_is_checked_on_prompts_the_plan_did_not_use():
    rows = spec_bench_rows(_speed())
    table = category_table(rows, BOOT)
    plans = pd.DataFrame({"pair": ["p"], "plan_prompts": ["r1,m1"]})
    check = recommendation_check(rows, table, plans).set_index("category")
    assert check.loc["rag", "held_out_share"] == pytest.approx(2 / 3)
    assert check.loc["all", "held_out_share"] == pytest.approx(4 / 6)
    assert check.loc["rag", "best_other"] == "speculative model k=4"
    text = markdown("c", table, check.reset_index(), plans, rows)
    assert "calibrated on prompts r1,m1; the check ran on m1, m2, m3, r1, r2, r3" in text
    assert "Spec-Bench leaderboard" in text


def test_a_campaign_without_spec_bench_runs_says_so():
    text = markdown("c", pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    assert "Not measured" in text and "prompts=spec_bench" in text
