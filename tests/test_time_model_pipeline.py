"""What the time model reads from the loop and the stages: the draft's catch-up and calls recorded per
iteration, the timing stage's contexts and prefills, the plan stage's recommendation and the speed
stage's recommended arm (tiny random pair)."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from store.best_fixed import best_fixed
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from pipeline_helpers import make_cfg
from speclab.decoding.drafters import HybridDrafter
from speclab.decoding.loop import speculative_generate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("merge_prefill", [True, False])
def test_loop_records_catch_up_calls_and_context(tiny_pair, one_torch_thread, merge_prefill):
    target, _ = tiny_pair
    ids = torch.tensor([[5, 9, 3, 7, 1, 2]])
    # The target as its own draft: all accepted.
    res = speculative_generate(target, target, ids, 20, k=3, merge_prefill=merge_prefill)
    its = res.iterations
    assert its[0].draft_fed == (6 if merge_prefill else 1)  # the whole prompt, or its last token
    assert its[0].target_fed == (6 if merge_prefill else 1) + 3
    assert all(it.target_fed == it.k + 1 and not it.with_prompt for it in its[1:])
    assert all(it.draft_fed == 2 for it in its[1:] if it.k)  # its unfed last proposal and the bonus token
    assert all(it.draft_calls == it.k for it in its)
    assert [it.length for it in its] == [6 + sum(i.new_tokens for i in its[:j]) for j in range(len(its))]


@pytest.mark.parametrize("merge_prefill", [True, False])
def test_hybrid_catches_up_everything_lookup_covered(tiny_pair, one_torch_thread, merge_prefill):
    target, draft = tiny_pair
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    res = speculative_generate(target, HybridDrafter(draft), ids, 24, k=3, merge_prefill=merge_prefill)
    model_its = [it for it in res.iterations if it.draft_calls]
    lookup_its = [it for it in res.iterations if it.k and not it.draft_calls]
    assert lookup_its and all(it.draft_fed == 0 for it in lookup_its)
    # Each model iteration feeds every token since the model last ran: after lookup iterations, more
    # than 2; merged, the model's first call runs the prompt and everything lookup covered since.
    seen = 0 if merge_prefill else 13
    for it in model_its:
        assert it.draft_fed == it.length - seen
        seen = min(it.length + it.k - 1, it.length + it.accepted)  # after its calls and the rollback


def _script(tmp_path, module, *args):
    """An analysis script in a folder whose params.yaml points at this test's outputs."""
    (tmp_path / "params.yaml").write_text(
        f"outputs_dir: {tmp_path / 'outputs'}\nanalysis_dir: {tmp_path / 'analysis'}\n"
        f"figures_dir: {tmp_path / 'figures'}\nmetrics_dir: {tmp_path / 'metrics'}\n"
        "bootstrap: {samples: 200, seed: 0, level: 0.95}\ntime_model: {campaign: scratch}\n")
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT)}, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.slow
def test_plan_recommends_speed_checks_it_and_the_time_model_is_validated(tmp_path):
    common = ["prompts.kinds=[prose,code]", "max_new_tokens=8"]
    cfg = make_cfg(tmp_path, "stage=plan", "stage.sample_precision=null", "stage.repeats=2", "stage.warmup=0", "stage.pass_lengths=[1,2,3]",
                   "stage.context_extra=[0,8]", "stage.acceptance_ks=[1,2]", "stage.bootstrap=100",
                   "prompts.per_kind=1", *common)
    run_parts(cfg)
    timing = pd.read_parquet(output_path(cfg, "timing"))
    assert set(timing.context_len[timing.context_len > 0].groupby(timing.prompt_id).nunique()) == {2}
    assert (timing.context_len == 0).any()  # prefills
    acc = pd.read_parquet(output_path(cfg, "acceptance"))
    assert set(zip(acc.drafter, acc.k_policy)) >= {("model", "fixed"), ("prompt_lookup", "fixed"),
                                                   ("hybrid", "fixed"), ("model", "cost_model")}
    assert (acc[acc.drafter == "prompt_lookup"].draft_calls == 0).all()
    plan = pd.read_parquet(output_path(cfg, "plan"))
    assert set(plan.kind) == {"prose", "code", "all"}
    assert plan.groupby("kind").recommended.sum().eq(1).all()
    assert ((plan.drafter == "none") & (plan.predicted == 1.0)).groupby(plan.kind).sum().eq(1).all()  # plain
    best = plan[plan.recommended].set_index("kind")
    # One sample prompt per kind: no kind's own best can pass the sign test, so every kind gets the
    # robust configuration (the best worst case over the sample prompts).
    robust = plan[plan.kind == "all"].sort_values(["worst_ratio", "predicted"], ascending=False).iloc[0]
    assert (best[["drafter", "k_policy", "k"]] == robust[["drafter", "k_policy", "k"]]).all().all()
    assert best.chosen_by.str.startswith("robust").all()
    # one or two sample prompts: no distribution-free 90% interval (it needs 5); plain's is exactly 1
    spec = plan[plan.drafter != "none"]
    assert spec.predicted_lo.isna().all() and spec.predicted_hi.isna().all()
    assert (plan[plan.drafter == "none"][["predicted_lo", "predicted_hi"]] == 1.0).all().all()

    held = make_cfg(tmp_path, "stage=acceptance", "stage.ks=[1,2]", "prompts.per_kind=1", "prompts.skip_per_kind=1",
                    *common)
    run_parts(held)
    assert not set(pd.read_parquet(output_path(held, "acceptance")).prompt_id) & set(acc.prompt_id)
    speed_cfg = make_cfg(tmp_path, "stage=speed", "stage.ks=[1,2]", "stage.arms=[{},{method:recommended}]", "stage.timing_repeats=2",
                         "stage.timing_warmup=0", "stage.block_timing_repeats=2", "prompts.per_kind=2",
                         "stage.race=false", "stage.precision=null", "stage.rounds=1", *common)  # the fixed design
    run_parts(speed_cfg)
    runs = pd.read_parquet(output_path(speed_cfg, "speed"))
    # Each block's step times, taken before its runs: one value per block, shared by its rows.
    assert (runs[["block_target_step_s", "block_draft_step_s"]] > 0).all().all()
    assert (runs.groupby("block")[["block_target_step_s", "block_draft_step_s"]].nunique() == 1).all().all()
    rec = runs[runs.arm == "recommended"]
    for r in rec.itertuples():
        chosen = best.loc[r.kind]
        assert (r.drafter, r.k_policy, r.k) == (chosen.drafter, chosen.k_policy, chosen.k)
    assert set(rec.block) == set(runs.block)  # in every block, beside plain
    # The check job's own run closes the loop on the prompt per kind the plan did not see.
    from pipeline.stages.speed import summarize as speed_summary
    closed = speed_summary(runs, speed_cfg)
    assert {"plan_measured_prose", "plan_measured_code", "plan_vs_best_prose"} <= set(closed.metrics)
    assert [line.split(":")[0] for line in closed.summary if line.startswith("plan check")] == \
        ["plan check code", "plan check prose"]
    assert "on 1 unseen prompts" in next(line for line in closed.summary if line.startswith("plan check"))

    # The confirmatory check: plain, the exploratory check's best fixed configuration (named now)
    # and the recommendation, in blocks of three.
    confirm_cfg = make_cfg(tmp_path, "stage=speed", "stage.arms=[{method:best_fixed},{method:recommended}]",
                           "stage.block_timing_repeats=2", "stage.timing_repeats=2", "stage.timing_warmup=0",
                           "prompts.per_kind=2", "stage.race=false", "stage.precision=null", "stage.rounds=1", *common)
    run_parts(confirm_cfg)
    confirm = pd.read_parquet(output_path(confirm_cfg, "speed"))
    named, spec = best_fixed(runs), confirm[confirm.arm == "speculative"]
    assert set(confirm.arm) == {"plain", "speculative", "recommended"} and confirm.groupby("block").size().eq(3).all()
    assert set(zip(spec.drafter, spec.k, spec.k_policy)) == {(named.drafter, named.k, "fixed")}

    printed = _script(tmp_path, "analysis.recommend", "--write")
    for kind in ("prose", "code"):
        label = "plain" if best.loc[kind].drafter == "none" else best.loc[kind].drafter
        assert any(line.split()[:3] == [kind, "recommended", label] for line in printed.splitlines()), printed
    check = pd.read_parquet(tmp_path / "analysis" / "recommendation_check.parquet")
    best_rows = check[(check.comparison == "recommended vs best fixed") & (check.kind == "all")].set_index("check")
    assert best_rows.blocks.to_dict() == {"exploratory": 4, "confirmatory": 4}
    assert best_rows.baseline_chosen["confirmatory"] == "before the runs: the exploratory check's best"
    assert best_rows.baseline["confirmatory"] == f"speculative {named.drafter} k={named.k}"

    _script(tmp_path, "analysis.time_model")
    points = pd.read_parquet(tmp_path / "analysis" / "time_model_points.parquet")
    assert set(points.k) == {1, 2} and set(points.kind) == {"prose", "code", "all"}
    assert (points.prompts == points.kind.map({"prose": 1, "code": 1, "all": 2})).all()  # held-out prompts only
    assert (points[["tm_own", "tm_kind", "iid_own", "tm_block", "iid_block"]] > 0).all().all()
    assert (points.tm_block_runs == points.runs).all()  # every held-out run priced at its block's step times
    # The loop's stopwatches account for its wall time: the measured parts add up to it.
    dec = pd.read_parquet(tmp_path / "analysis" / "time_model_decomposition.parquet")
    meas = dec[dec.source == "measured"]
    parts = meas[["prefill_ms", "draft_steps_ms", "verify_ms", "rollback_ms", "bookkeeping_ms"]].sum(axis=1)
    assert ((parts / meas.wall_ms).between(0.9, 1.0001)).all()
    assert (tmp_path / "figures" / "time_model_decomposition.png").stat().st_size > 0


def test_recommended_arm_without_a_plan_is_one_line(tmp_path):
    for arms in ("stage.arms=[{},{method:recommended}]", "stage.arms=[{method:recommended}]"):
        cfg = make_cfg(tmp_path, "stage=speed", arms, "prompts.per_kind=1", "prompts.kinds=[code]")
        with pytest.raises(ValueError, match=r"a recommended arm \(stage.arms\) needs a plan for pair tiny_random in "
                                             r"campaign scratch"):
            run_parts(cfg)


def test_best_fixed_arm_without_an_exploratory_check_is_one_line(tmp_path):
    cfg = make_cfg(tmp_path, "stage=speed", "stage.arms=[{method:best_fixed}]", "prompts.per_kind=1",
                   "prompts.kinds=[code]")
    with pytest.raises(ValueError, match=r"a best_fixed arm \(stage.arms\) needs an exploratory check of pair tiny_random "
                                         r"in campaign scratch .*run `python -m pipeline.run \+sweep=check_plan"):
        run_parts(cfg)
