"""The headline numbers of the current results, as plain text (what the closing notes quote).

    python -m analysis.headline    (reads outputs/analysis/*.parquet; run `dvc repro` first)
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.common import load_params, published_campaign, read_stage, read_table, run_script
from analysis.drift import drift_table, drop_drifted



def main() -> None:
    params = load_params()
    out = Path(params["analysis_dir"])
    pd.set_option("display.width", 200)
    acc = read_table(out, "acceptance_table")
    if not acc.empty:
        print("alpha (accepted/checked) per kind and k:")
        print(acc.pivot_table(index="kind", columns="k", values="alpha").round(3).to_string())
        print("tokens per target pass measured / i.i.d. formula:")
        t = acc.assign(v=acc.tokens_per_pass.round(2).astype(str) + " / " + acc.formula_iid.round(2).astype(str))
        print(t.pivot_table(index="kind", columns="k", values="v", aggfunc="first").to_string())
    pts = read_table(out, "speed_points")
    if not pts.empty:
        print("measured speed-up (median of adjacent-run ratios) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="measured").round(2).to_string())
        print("predicted (i.i.d.) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="predicted_iid").round(2).to_string())
        print("predicted (empirical acceptance + overhead) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="predicted_empirical").round(2).to_string())
    speed = read_stage(params["outputs_dir"], "speed", published_campaign(params))
    if not speed.empty:
        speed = drop_drifted(speed, drift_table(speed, float(params["drift"]["max_ratio"])))
        fixed = speed[(speed.arm == "speculative") & (speed.k_policy == "fixed") & (speed.drafter == "model")
                      & ~speed.do_sample]
        parts = ["draft_s_per_iter", "verify_s_per_iter", "rollback_s_per_iter", "bookkeeping_s_per_iter"]
        print("time per iteration (ms), greedy model draft, fixed k, drift-flagged jobs excluded:")
        print((1e3 * fixed.groupby("k")[parts].mean()).round(2).assign(runs=fixed.groupby("k").size()).to_string())
    for name in ("predictor_errors", "best_k", "drift", "divergence_counts", "distribution_rates",
                 "drafter_comparison", "adaptive_vs_fixed"):
        df = read_table(out, name)
        if not df.empty:
            print(f"{name}:")
            print(df.round(4).to_string(index=False))
    sampled = read_table(out, "sampled_alpha")
    if not sampled.empty:
        print("sampled vs greedy alpha:")
        print(sampled[sampled.kind == "all"].round(3).to_string(index=False))
    speed = read_table(out, "strategy_speedups")
    if not speed.empty:
        print("strategy speed-ups:")
        print(speed.round(3).to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.headline", main)
