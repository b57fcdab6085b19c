"""Does the plan hold on prompts it has not seen? Per kind, the latest plan of a campaign against its check on
other prompts of the kind: the recommendation's measured speed-up inside the plan's interval for an unseen prompt,
and at least 0.95 of the best arm measured beside it; and the plan
job's time on this machine (its timing part's start to its plan part's end).

The runs (Qwen2.5-Coder bf16, the shipped Spec-Bench kinds, 48 new tokens; run alone on a quiet machine):

    python -m pipeline.run +sweep=plan pair=qwen25_coder_bf16 prompts=spec_bench campaign=plan38 max_new_tokens=48
    python -m pipeline.run +sweep=check_plan pair=qwen25_coder_bf16 prompts=spec_bench prompts.skip_per_kind=8 \\
        prompts.per_kind=4 campaign=plan38 max_new_tokens=48 'stage.ks=[2,4]' stage.rounds=2 \\
        'stage.arms=[{},{drafter:prompt_lookup,k_policy:fixed,ks:[4]},{drafter:hybrid,k_policy:fixed,ks:[4]},{method:recommended}]'
    python -m benchmarks.plan_unseen --campaign plan38

Writes outputs/benchmarks/plan_unseen.parquet (one row per kind) and prints it. No model runs here.
"""
from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

import pandas as pd

from analysis.common import bootstrap_settings, load_params, markdown_table
from analysis.recommend import plan_summary, recommendation
from store.plan_check import SHORTFALL
from store.records import read_meta

OUT = Path("outputs/benchmarks")


def plan_minutes(outputs: str, campaign: str, plan: pd.DataFrame) -> float:
    """The plan job's wall time: its timing part's start to its plan part's end (the provenance records)."""
    stem = f"{plan.pair.iloc[0]}-{plan.config_hash.iloc[0]}.parquet"
    folder = Path(outputs) / "campaigns" / campaign
    began = read_meta(folder / "timing" / stem)["started_at"]
    ended = read_meta(folder / "plan" / stem)["finished_at"]
    return (datetime.fromisoformat(ended) - datetime.fromisoformat(began)).total_seconds() / 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", default="plan38")
    args = ap.parse_args()
    params = load_params()
    rec = recommendation(params["outputs_dir"], args.campaign, bootstrap_settings(params))
    if rec is None or rec.unseen.prompts_checked.sum() == 0:
        raise SystemExit(f"campaign {args.campaign!r} holds no plan with a check on unseen prompts: run the commands "
                         "in this script's docstring first")
    summary = plan_summary(rec.plan)[["pair", "kind", "chosen", "sample", "sample_stop", "cv_gain", "cv_error"]]
    table = rec.unseen.merge(summary, on=["pair", "kind"])
    table = table.assign(plan_minutes=plan_minutes(params["outputs_dir"], args.campaign, rec.plan),
                         campaign=args.campaign)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_parquet(OUT / "plan_unseen.parquet", index=False)
    print(markdown_table(table.drop(columns=["sample_stop"])))
    for r in table.itertuples():
        print(f"{r.kind}: sample {r.sample} ({r.sample_stop}); measured {r.measured:.2f} "
              f"{'inside' if r.measured_inside else 'OUTSIDE'} {r.unseen_lo:.2f}-{r.unseen_hi:.2f}; "
              f"{r.vs_best:.2f} of {r.best_arm} ({r.vs_best_lo:.2f}-{r.vs_best_hi:.2f}): "
              + ("holds" if r.holds else f"below {SHORTFALL}: a miss"))
    print(f"plan job: {table.plan_minutes.iloc[0]:.1f} minutes; every kind inside: {bool(table.measured_inside.all())}; "
          f"every kind holds: {bool(table.holds.all())}; written to {OUT / 'plan_unseen.parquet'}")


if __name__ == "__main__":
    main()
