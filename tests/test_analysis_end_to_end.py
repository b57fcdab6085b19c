"""The analysis scripts on real (tiny-pair) pipeline outputs: every table, figure and the report."""
import yaml

from analysis import breakeven, correctness, drift, fit, jobs, report, strategies
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

SMALL = ("stage.repeats=2", "stage.warmup=0", "stage.timing_repeats=2", "stage.timing_warmup=0",
         "stage.draws=5000", "stage.seeds=[0]", "stage.power_sims=20", "stage.pass_lengths=[1,2,3,4,5,6,7]")


def test_analysis_scripts_produce_report(tmp_path, monkeypatch):
    outputs = tmp_path / "outputs"
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=all", "stage.ks=[1,2]", "stage.acceptance_ks=[1,2]",
                       "stage.k_policies=[cost_model,heuristic]",
                       *SMALL))
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=speed", "drafter=prompt_lookup", "stage.ks=[2]",
                       "stage.timing_repeats=2", "stage.timing_warmup=0"))
    run_parts(make_cfg(tmp_path, "campaign=e2e", "stage=acceptance", "sampling=t07", "stage.ks=[2]"))
    params = yaml.safe_load(open("params.yaml"))
    params.update(campaign="e2e", outputs_dir=str(outputs), analysis_dir=str(outputs / "analysis"),
                  figures_dir=str(outputs / "figures"))
    params["drift"]["tag_mlflow"] = False
    params["drift"]["max_ratio"] = 100.0  # tiny-model step times are too short to judge drift by
    params["bootstrap"]["samples"] = 200
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    for script in (jobs, drift, fit, breakeven, correctness, strategies, report):
        script.main()
    figs = {p.name for p in (outputs / "figures").glob("*.png")}
    assert {"drift.png", "alpha_by_k.png", "tokens_per_pass.png", "speedup_predicted_vs_measured.png",
            "step_time_vs_pass_length.png", "speedup_map_tiny_random.png", "strategies.png", "sampled_alpha.png",
            "distribution_rejections.png"} <= figs
    text = (outputs / "report.md").read_text()
    for heading in ("## Verdict", "## Acceptance", "## Speed: predicted vs measured", "## Drafters and k policies",
                    "## Sampling: acceptance against greedy", "## Drift", "## Greedy correctness",
                    "## Sampling correctness"):
        assert heading in text
    assert "figure not produced" not in text
    assert "Campaign: **e2e**" in text and "## Jobs pooled" in text
    import pandas as pd

    sampled = pd.read_parquet(outputs / "analysis" / "sampled_alpha.parquet")
    assert {"greedy", "T=0.7"} <= set(sampled.sampling)
    drafters = pd.read_parquet(outputs / "analysis" / "drafter_comparison.parquet")
    assert {"model", "prompt_lookup"} <= set(drafters.drafter)
    adaptive = pd.read_parquet(outputs / "analysis" / "adaptive_vs_fixed.parquet")
    assert {"cost_model", "heuristic"} <= set(adaptive.policy)
    pooled = pd.read_parquet(outputs / "analysis" / "jobs.parquet")
    assert set(pooled.campaign) == {"e2e"} and set(pooled.stage) == {"timing", "acceptance", "speed", "divergence",
                                                                    "distribution"}
    assert pooled.finished_at.notna().all() and pooled.git_commit.notna().all()
