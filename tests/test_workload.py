"""My workload, my answer (pipeline/workload.py): a user's JSONL becomes a plan on the first prompts of each
category and a check on the others, and one closing block per category."""
import json
import math

import pandas as pd
import pytest

from pipeline.workload import PLAN_PER_KIND, WorkloadError, answer_lines, check_command, plan_command, read_workload


def _jsonl(path, counts):
    lines = [json.dumps({"question_id": f"{cat}-{i}", "category": cat, "turns": [f"question {i} about {cat}"]})
             for cat, n in counts.items() for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_plan_and_its_check_never_share_a_prompt(tmp_path):
    w = read_workload(str(_jsonl(tmp_path / "my chats.jsonl", {"chat": 5, "code": 4})))
    assert w.kinds == {"chat": 5, "code": 4} and w.campaign == "workload-my-chats"
    plan = plan_command(w, ["pair=tiny_random"])
    # the plan grows its sample (stage.sample_precision at its default) up to 3 prompts: code keeps one to check
    assert f"prompts.per_kind={PLAN_PER_KIND}" in plan and "stage=plan" in plan and "stage.sample_max_prompts=3" in plan
    assert not any(o.startswith("stage.sample_precision") for o in plan)
    # the check skips the largest sample the plan grew to
    check = check_command(w, ["pair=tiny_random"], 3)
    assert "prompts.skip_per_kind=3" in check and "stage.arms=[{method:recommended}]" in check
    # 1 held-out prompt of code: 6 rounds give the 6 runs a 95% interval needs
    assert "stage.rounds=6" in check and "campaign=workload-my-chats" in check
    assert "stage.rounds=3" in check_command(w, ["pair=tiny_random"], 2)
    assert "prompts.kinds=['chat','code']" in check and plan[-1] == check[-1] == "pair=tiny_random"


def test_the_users_values_replace_the_commands_own(tmp_path):
    w = read_workload(str(_jsonl(tmp_path / "w.jsonl", {"chat": 3})))
    check = check_command(w, ["campaign=mine", "stage.rounds=1"], 2)
    assert [c for c in check if c.startswith(("campaign=", "stage.rounds="))] == ["campaign=mine", "stage.rounds=1"]


def test_a_category_too_small_to_plan_and_check_is_one_line(tmp_path):
    with pytest.raises(WorkloadError, match=r"categories \{'code': 2\} .* each needs at least 3"):
        read_workload(str(_jsonl(tmp_path / "w.jsonl", {"chat": 4, "code": 2})))
    with pytest.raises(WorkloadError, match="is not a readable .jsonl file"):
        read_workload(str(tmp_path / "missing.jsonl"))


def test_the_answer_says_choice_prediction_measurement_and_cost():
    plan = pd.DataFrame([
        {"kind": "chat", "recommended": True, "k": 4, "k_policy": "fixed", "drafter": "prompt_lookup",
         "predicted": 1.3, "predicted_lo": 1.1, "predicted_hi": 1.5, "level": 0.9},
        {"kind": "chat", "recommended": False, "k": 2, "k_policy": "fixed", "drafter": "model",
         "predicted": 1.0, "predicted_lo": math.nan, "predicted_hi": math.nan, "level": 0.9},
        {"kind": "all", "recommended": True, "k": 4, "k_policy": "fixed", "drafter": "model",
         "predicted": 1.2, "predicted_lo": math.nan, "predicted_hi": math.nan, "level": 0.9},
        {"kind": "code", "recommended": True, "k": 4, "k_policy": "fixed", "drafter": "model",
         "predicted": 1.2, "predicted_lo": math.nan, "predicted_hi": math.nan, "level": 0.9}])
    ratios = [1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.22]
    speed = pd.DataFrame([{"arm": "recommended", "kind": "chat", "ratio_to_adjacent_plain": r, "wall_s": 6.0}
                          for r in ratios] + [{"arm": "plain", "kind": "chat", "ratio_to_adjacent_plain": 1.0,
                                               "wall_s": 6.0}])
    lines = answer_lines(plan, speed, 3.5)
    assert lines[0] == ("chat: prompt lookup k=4, predicted x1.30 (90% 1.10-1.50); measured on held-out "
                               "prompts x1.33 (95% interval 1.20-1.50, 8 runs): speculate")
    assert lines[1] == "code: draft model k=4, predicted x1.20; not checked"
    assert lines[-1] == "cost: 3.5 min here (plan and check), 0.9 min of timed runs"


def test_a_plan_that_chose_plain_decoding_says_use_plain_whatever_the_noise():
    plan = pd.DataFrame([{"kind": "chat", "recommended": True, "k": 0, "k_policy": "none", "drafter": "none",
                          "predicted": 1.0, "predicted_lo": 1.0, "predicted_hi": 1.0, "level": 0.9}])
    speed = pd.DataFrame([{"arm": "recommended", "kind": "chat", "ratio_to_adjacent_plain": r, "wall_s": 1.0}
                          for r in (1.02, 1.05, 1.07, 1.08, 1.1, 1.12)])
    line = answer_lines(plan, speed, 1.0)[0]
    assert line.startswith("chat: plain decoding, predicted x1.00") and line.endswith(
        ": use plain (plain beside plain: the noise of this machine)")
