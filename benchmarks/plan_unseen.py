"""Does the plan hold on prompts it has not seen? Per kind, the latest plan of a campaign against its check on
other prompts of the kind: the recommendation's measured speed-up inside the plan's interval for an unseen prompt,
and at least 0.95 of the best arm measured beside it; the plan job's time on this machine (its timing part's start
to its plan part's end); and the plan's error split into sample and model (speclab/costs/error_split.py): the
unseen prompts' own acceptance (an acceptance part run on them) priced by the plan's time model, beside the plan's
prediction and the check's measurement, for the recommendation and every configuration the check ran.

The runs (Qwen2.5-Coder bf16, the shipped Spec-Bench kinds, 48 new tokens; run alone on a quiet machine):

    python -m pipeline.run +sweep=plan pair=qwen25_coder_bf16 prompts=spec_bench campaign=plan49 max_new_tokens=48
    python -m pipeline.run +sweep=check_plan pair=qwen25_coder_bf16 prompts=spec_bench prompts.skip_per_kind=8 \\
        prompts.per_kind=4 campaign=plan49 max_new_tokens=48 'stage.ks=[2,4]' stage.rounds=2 \\
        'stage.arms=[{},{drafter:prompt_lookup,k_policy:fixed,ks:[4]},{drafter:hybrid,k_policy:fixed,ks:[4]},{method:recommended}]'
    python -m pipeline.run +sweep=plan pair=qwen25_coder_bf16 prompts=spec_bench campaign=plan49 max_new_tokens=48 \\
        prompts.skip_per_kind=8 prompts.per_kind=4 'stage.parts=[acceptance]' stage.sample_precision=null
    python -m benchmarks.plan_unseen --campaign plan49

The third command is the plan's acceptance part alone, on the check's prompts (without it the split is not priced).
Writes outputs/benchmarks/plan_unseen.parquet (one row per kind) and plan_error_split.parquet (one row per kind and
configuration the check measured) and prints them. No model runs here.
"""
from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

import pandas as pd

from analysis.common import bootstrap_settings, load_params, markdown_table
from analysis.recommend import other_plans, plan_summary, read_speed, recommendation
from pipeline.engines.base import DEFAULT_ENGINE, engine_class
from speclab.costs.error_split import split
from speclab.costs.planning import CONFIG_KEYS, price_runs
from store.layout import stage_dir
from store.plan_check import SHORTFALL, plan_prompts
from store.records import read_meta

OUT = Path("outputs/benchmarks")


def plan_minutes(outputs: str, campaign: str, plan: pd.DataFrame) -> float:
    """The plan job's wall time: its timing part's start to its plan part's end (the provenance records)."""
    stem = f"{plan.pair.iloc[0]}-{plan.config_hash.iloc[0]}.parquet"
    folder = Path(outputs) / "campaigns" / campaign
    began = read_meta(folder / "timing" / stem)["started_at"]
    ended = read_meta(folder / "plan" / stem)["finished_at"]
    return (datetime.fromisoformat(ended) - datetime.fromisoformat(began)).total_seconds() / 60


def unseen_acceptance(outputs: str, campaign: str, plan: pd.DataFrame) -> pd.DataFrame:
    """The acceptance runs of the campaign on prompts the plan did not see (each prompt from the newest job that
    ran it), for the plan's pair."""
    seen, pair = plan_prompts(plan), plan.pair.iloc[0]
    files = sorted(stage_dir(outputs, campaign, "acceptance").glob(f"{pair}-*.parquet"),
                   key=lambda f: read_meta(f).get("finished_at") or "", reverse=True)
    out, taken = [], set()
    for f in files:
        rows = pd.read_parquet(f)
        rows = rows[~rows.prompt_id.isin(seen | taken)]
        taken |= set(rows.prompt_id)
        out.append(rows)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def error_split(outputs: str, campaign: str, plan: pd.DataFrame) -> pd.DataFrame:
    """Per kind and configuration the check ran on the plan's unseen prompts: the plan's prediction, the unseen
    prompts' acceptance priced by the plan's model, the measurement (speclab.costs.error_split)."""
    stem = f"{plan.pair.iloc[0]}-{plan.config_hash.iloc[0]}.parquet"
    folder = Path(outputs) / "campaigns" / campaign
    unseen = unseen_acceptance(outputs, campaign, plan)
    speed = read_speed(outputs, campaign)
    if unseen.empty or speed.empty:
        return pd.DataFrame()
    engine = str(plan.engine.iloc[0]) if "engine" in plan else DEFAULT_ENGINE
    priced = price_runs(pd.read_parquet(folder / "timing" / stem), pd.read_parquet(folder / "acceptance" / stem),
                        unseen, engine_class(engine).counts_iterations)
    runs = speed[~other_plans(speed, plan) & (speed.arm != "plain") & speed.prompt_id.isin(set(unseen.prompt_id))]
    measured = (runs.groupby(["prompt_id", "kind", *CONFIG_KEYS]).ratio_to_adjacent_plain.median()
                .rename("measured").reset_index())
    configs = plan[plan.kind != "all"].merge(measured[["kind", *CONFIG_KEYS]].drop_duplicates(), on=["kind", *CONFIG_KEYS])
    out = split(configs, priced, measured)
    chosen = plan[plan.recommended][["kind", *CONFIG_KEYS]].assign(recommended=True)
    return out.merge(chosen, on=["kind", *CONFIG_KEYS], how="left").fillna({"recommended": False})


def split_text(r) -> str:
    """A kind's error, measured - predicted, as sample + model."""
    sample = getattr(r, "sample_error", float("nan"))
    if sample != sample:
        return "; the error is not split: no acceptance on the unseen prompts (the docstring's third command)"
    return (f"; error {r.measured - r.predicted:+.2f} = sample {sample:+.2f} (the unseen prompts' acceptance priced "
            f"{r.priced_unseen:.2f}) + model {r.model_error:+.2f} (per prompt {r.model_error_lo:+.2f} to "
            f"{r.model_error_hi:+.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", default="plan49")
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
    errors = error_split(params["outputs_dir"], args.campaign, rec.plan)
    if len(errors):
        mine = errors[errors.recommended][["kind", "priced_unseen", "sample_error", "model_error", "model_error_lo",
                                           "model_error_hi"]]
        table = table.merge(mine, on="kind", how="left")
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_parquet(OUT / "plan_unseen.parquet", index=False)
    if len(errors):
        errors.assign(campaign=args.campaign).to_parquet(OUT / "plan_error_split.parquet", index=False)
        print(markdown_table(errors))
    print(markdown_table(table.drop(columns=["sample_stop"])))
    for r in table.itertuples():
        print(f"{r.kind}: sample {r.sample} ({r.sample_stop}); measured {r.measured:.2f} "
              f"{'inside' if r.measured_inside else 'OUTSIDE'} {r.unseen_lo:.2f}-{r.unseen_hi:.2f}; "
              f"{r.vs_best:.2f} of {r.best_arm} "
              + (f"({r.vs_best_lo:.2f}-{r.vs_best_hi:.2f}): " if r.vs_best_lo == r.vs_best_lo else "(no interval): ")
              + ("holds" if r.holds else f"below {SHORTFALL}: a miss")
              + split_text(r))
    print(f"plan job: {table.plan_minutes.iloc[0]:.1f} minutes; every kind inside: {bool(table.measured_inside.all())}; "
          f"every kind holds: {bool(table.holds.all())}; written to {OUT / 'plan_unseen.parquet'}")


if __name__ == "__main__":
    main()
