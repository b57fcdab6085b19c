"""The analysis scripts on real (tiny-pair) pipeline outputs: every table, figure, metric, plot file and the report."""
import json

import yaml

from analysis import breakeven, correctness, drift, fit, headline, jobs, report, strategies
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

SMALL = ("stage.repeats=2", "stage.warmup=0", "stage.timing_repeats=2", "stage.timing_warmup=0",
         "stage.draws=5000", "stage.seeds=[0]", "stage.power_sims=20", "stage.pass_lengths=[1,2,3,4,5,6,7]")


def test_analysis_scripts_produce_report(tmp_path, monkeypatch):
    outputs = tmp_path / "outputs"
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=all", "stage.ks=[1,2]", "stage.acceptance_ks=[1,2]",
                       "stage.arms=[{},{k_policy:cost_model},{k_policy:heuristic}]",
                       *SMALL))
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=speed", "drafter=prompt_lookup", "stage.ks=[2]",
                       "stage.timing_repeats=2", "stage.timing_warmup=0"))
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=acceptance", "sampling=t07", "stage.ks=[2]"))
    params = yaml.safe_load(open("params.yaml"))
    params.update(campaign="e2e", outputs_dir=str(outputs), analysis_dir=str(outputs / "analysis"),
                  figures_dir=str(outputs / "figures"), metrics_dir=str(outputs / "metrics"))
    params["mlflow"]["enabled"] = False
    params["headline"]["alpha_k"] = 2
    params["drift"]["max_ratio"] = 100.0  # tiny-model step times are too short to judge drift by
    params["bootstrap"]["samples"] = 200
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    for script in (jobs, drift, fit, breakeven, correctness, strategies, headline, report):
        script.main()
    figs = {p.name for p in (outputs / "figures").glob("*.png")}
    assert figs == {"drift.png", "alpha_by_k.png", "tokens_per_pass.png", "speedup_predicted_vs_measured.png",
                    "step_time_vs_pass_length.png", "speedup_map.png", "strategies.png", "sampled_alpha.png",
                    "distribution_rejections.png"}  # exactly the names dvc.yaml declares
    assert {p.name for p in (outputs / "metrics" / "plots").glob("*.csv")} == {
        "speed_points.csv", "speed_predictions.csv", "alpha_by_k.csv", "step_time.csv"}
    metrics = json.loads((outputs / "metrics" / "detail" / "headline.json").read_text())
    assert metrics["campaign"] == "e2e"
    assert set(metrics["tiny_random"]) == {"best_k", "speedup_at_best_k", "alpha_at_k2", "mae_iid",
                                           "mae_empirical_overhead"}
    assert set(metrics["tiny_random"]["best_k"]) == {"all", "code", "prose", "structured"}
    text = (outputs / "report.md").read_text()
    appendix = (outputs / "report_appendix.md").read_text()  # every full section, linked from the report
    assert "## Speed, drafters and batches (campaign e2e)" in text
    for heading in ("## Verdict", "## Acceptance", "## Speed: predicted vs measured", "## Drafters and k policies",
                    "## Sampling: acceptance against greedy", "## Drift", "## Greedy correctness",
                    "## Sampling correctness"):
        assert heading in appendix and f"(report_appendix.md#{report.anchor(heading[3:])}" in text
    assert "figure not produced" not in text + appendix
    assert "Campaign: **e2e**" in text and "## Jobs pooled" in appendix
    import pandas as pd

    sampled = pd.read_parquet(outputs / "analysis" / "sampled_alpha.parquet")
    assert {"greedy", "T=0.7"} <= set(sampled.sampling)
    drafters = pd.read_parquet(outputs / "analysis" / "drafter_comparison.parquet")
    assert {"model", "prompt_lookup"} <= set(drafters.drafter)
    adaptive = pd.read_parquet(outputs / "analysis" / "adaptive_vs_fixed.parquet")
    assert {"cost_model", "heuristic"} <= set(adaptive.policy)
    comparison = pd.read_parquet(outputs / "analysis" / "strategy_comparison.parquet")
    assert {"draft model, best fixed k", "draft model, adaptive k (cost model)", "draft model, adaptive k (heuristic)",
            "prompt lookup, best fixed k"} <= set(comparison.strategy)
    has = comparison.speedup_lo.notna()  # a tiny campaign: an interval only where an arm has enough runs
    assert (comparison.speedup_lo[has] <= comparison.speedup[has]).all()
    assert (comparison.speedup[has] <= comparison.speedup_hi[has]).all()
    assert (has == (comparison.runs >= 6)).all()
    pooled = pd.read_parquet(outputs / "analysis" / "jobs.parquet")
    assert set(pooled.campaign) == {"e2e"} and set(pooled.stage) == {"timing", "acceptance", "speed", "divergence",
                                                                    "distribution"}
    assert pooled.finished_at.notna().all() and pooled.git_commit.notna().all()
