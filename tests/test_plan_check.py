"""The check closes the plan's loop per kind: the recommendation measured on prompts the plan did not see, inside
its interval for an unseen prompt or not, and against the best arm measured beside it; over checks, the track
record."""
import numpy as np
import pandas as pd

from store.plan_check import kind_checks, plan_prompts, track_record


def _plan(kind_rows: list[dict]) -> pd.DataFrame:
    base = {"pair": "p", "recommended": True, "k_policy": "fixed", "prompts": 4, "predicted": 1.5, "unseen_coverage": 0.6,
            "runner_up_margin": 1.1, "prompt_ids": "a1,a2,b1,b2"}
    rows = [{**base, **r} for r in kind_rows]
    return pd.DataFrame(rows + [{**base, "kind": "all", "drafter": "model", "k": 4, "unseen_lo": 1.0,
                                 "unseen_hi": 2.0}])


def _speed(speedups: dict[str, dict[str, float]], prompts: dict[str, list[str]], rounds: int = 2) -> pd.DataFrame:
    """Rows of a check job: per kind, each prompt in each round one block of plain and every arm at its speed-up
    (arm name -> (method, drafter, k) by the label), noise-free."""
    arms = {"recommended": ("recommended", "model", 4), "lookup": ("speculative", "prompt_lookup", 4),
            "draft2": ("speculative", "model", 2), "draft4": ("speculative", "model", 4)}
    rows, block = [], 0
    for kind, ps in prompts.items():
        for rnd in range(rounds):
            for p in ps:
                block += 1
                rows.append({"pair": "p", "kind": kind, "prompt_id": p, "config_hash": "c", "round": rnd,
                             "block": block, "arm": "plain", "drafter": "none", "k": 0, "k_policy": "none",
                             "tokens_per_s": 10.0, "ratio_to_adjacent_plain": 1.0})
                for name, v in speedups[kind].items():
                    method, drafter, k = arms[name]
                    rows.append({"pair": "p", "kind": kind, "prompt_id": p, "config_hash": "c", "round": rnd,
                                 "block": block, "arm": method, "drafter": drafter, "k": k, "k_policy": "fixed",
                                 "tokens_per_s": 10.0 * v, "ratio_to_adjacent_plain": v})
    return pd.DataFrame(rows)


PLAN = _plan([{"kind": "a", "drafter": "model", "k": 4, "unseen_lo": 1.2, "unseen_hi": 1.6},
              {"kind": "b", "drafter": "model", "k": 4, "unseen_lo": 1.2, "unseen_hi": 1.6}])


def test_each_kind_is_checked_on_unseen_prompts_against_its_interval_and_the_best_arm():
    speed = _speed({"a": {"recommended": 1.4, "lookup": 1.2, "draft2": 1.3},
                    "b": {"recommended": 1.8, "lookup": 2.0, "draft2": 1.1}},
                   {"a": ["a1", "a3", "a4", "a5"], "b": ["b3", "b4", "b5", "b6"]}, rounds=2)
    # A prompt the plan saw, far outside: never counted.
    seen = _speed({"a": {"recommended": 9.0, "lookup": 1.0, "draft2": 1.0}}, {"a": ["a2"]}).assign(block=999)
    out = kind_checks(pd.concat([speed, seen], ignore_index=True), PLAN).set_index("kind")
    assert plan_prompts(PLAN) == {"a1", "a2", "b1", "b2"}
    assert out.loc["a"].prompts_checked == 3 and out.loc["b"].prompts_checked == 4
    assert out.loc["a"].measured == 1.4 and out.loc["a"].measured_inside and out.loc["a"].inside == 3
    assert not out.loc["b"].measured_inside and out.loc["b"].inside == 0  # 1.8 above the interval
    assert out.loc["a"].best_arm == "draft model k=2" and abs(out.loc["a"].vs_best - 1.4 / 1.3) < 1e-12
    assert out.loc["b"].best_arm == "prompt lookup k=4" and abs(out.loc["b"].vs_best - 0.9) < 1e-12
    assert out.loc["a"].blocks == 6 and out.loc["a"].vs_best_lo == out.loc["a"].vs_best_lo  # 6 blocks: an interval
    assert out.loc["a"].holds and not out.loc["b"].holds  # 0.9 < 0.95
    record = track_record(out.reset_index())
    assert record["checks"] == 2 and record["inside_share"] == 0.5 and record["holds_share"] == 0.5
    assert record["prompts_checked"] == 7 and abs(record["prompts_inside_share"] - 3 / 7) < 1e-12


def test_a_shortfall_is_a_miss_even_where_the_plan_could_not_tell_its_choice_from_the_runner_up():
    plan = PLAN.assign(runner_up_margin=0.97)
    speed = _speed({"a": {"recommended": 1.8, "lookup": 2.0}, "b": {"recommended": 1.5, "lookup": 1.0}},
                   {"a": ["a3", "a4", "a5"], "b": ["b3", "b4", "b5"]})
    out = kind_checks(speed, plan).set_index("kind")
    assert out.loc["a"].vs_best < 0.95 and not out.loc["a"].told_apart and not out.loc["a"].holds
    assert track_record(out.reset_index())["holds_share"] == 0.5


def test_an_arm_of_the_recommendations_own_configuration_is_not_its_rival():
    speed = _speed({"a": {"recommended": 1.4, "draft4": 1.6, "lookup": 1.2}, "b": {"recommended": 1.4, "lookup": 1.2}},
                   {"a": ["a3", "a4", "a5"], "b": ["b3", "b4", "b5"]})
    out = kind_checks(speed, PLAN).set_index("kind")
    assert out.loc["a"].best_arm == "prompt lookup k=4" and out.loc["a"].vs_best > 1


def test_no_check_runs_and_plans_without_intervals_are_counted_as_such():
    empty = kind_checks(pd.DataFrame(columns=["pair", "kind", "prompt_id", "arm"]), PLAN)
    assert (empty.prompts_checked == 0).all() and empty.measured.isna().all()
    assert track_record(empty)["checks"] == 0
    old = PLAN.assign(unseen_lo=np.nan, unseen_hi=np.nan, unseen_coverage=np.nan)
    speed = _speed({"a": {"recommended": 1.4, "lookup": 1.2}, "b": {"recommended": 1.4, "lookup": 1.2}},
                   {"a": ["a3"], "b": ["b3"]})
    out = kind_checks(speed, old)
    assert out.inside.isna().all() and out.measured_inside.isna().all()
    assert np.isnan(track_record(out)["inside_share"])
