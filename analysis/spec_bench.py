"""The Spec-Bench table: per pair and category, every speed arm's tokens/s and speed-up by both definitions.

    python -m analysis.spec_bench     (reads outputs/campaigns/<spec_bench_campaign>/, writes
                                       outputs/analysis/spec_bench_table.parquet, outputs/analysis/spec_bench/,
                                       outputs/metrics/detail/spec_bench.json)

Spec-Bench (Xia et al., Findings of ACL 2024) reports a method's speed-up as the mean over questions of its
tokens/s over the mean of the baseline's, from runs taken at different times. speclab's is the median of
within-block ratios (each run over the plain run of the same prompt, adjacent in time), with a 95% distribution-free
interval. Both are given per category, with mean accepted tokens per target pass, alpha and the share of runs
whose output equals plain greedy. Rows are speed-stage runs on Spec-Bench's categories (any kind that is one:
``SPEC_BENCH_KINDS``); drifted jobs are left out as everywhere else. Where the campaign has a plan, the
recommendation is checked per category on the prompts the plan did not use, and the section names both sets.
The leaderboard's published rows are shown beside the table as a reference measured on other hardware.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, markdown_table, read_stage_if_any,
                             run_script, save_json, save_table)
from analysis.drift import drift_table, drop_drifted
from analysis.inputs import AnalysisError, campaign_dir
from analysis.recommend import config_label, read_plans
from speclab.specs.prompt_pools import MT_BENCH, POOLS
from store.plans import latest_plan
from store.files import atomic_write_text

SPEC_BENCH_KINDS = {*MT_BENCH, *POOLS, "math_reasoning", "rag", "translation", "summarization", "qa"}
ALL = "all"
# Spec-Bench's leaderboard (A100, Vicuna-7B, fp16, greedy, overall): published numbers, not measured here.
LEADERBOARD = pd.DataFrame([
    ("EAGLE-2", 2.36, 4.34), ("EAGLE", 2.10, 3.58), ("Medusa", 1.71, 2.31), ("PLD (prompt lookup)", 1.66, 1.75),
    ("SpS (draft model, vicuna-68m)", 1.52, 2.28), ("Lookahead", 1.34, 1.64)],
    columns=["method", "speedup", "accepted_tokens_per_pass"])
LEADERBOARD_SOURCE = ("Spec-Bench leaderboard (github.com/hemingkx/Spec-Bench; A100, Vicuna-7B, fp16, greedy): "
                      "other hardware and models, a reference only")


def spec_bench_rows(speed: pd.DataFrame) -> pd.DataFrame:
    """The speed rows on Spec-Bench categories, each labelled with its arm's configuration."""
    rows = speed[speed.kind.isin(SPEC_BENCH_KINDS)]
    return rows.assign(config=np.where(rows.arm == "plain", "plain", config_label(rows)))


def category_table(rows: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair, category (and all categories) and arm: both speed-ups, tokens per pass, alpha, exactness."""
    out = []
    pooled = pd.concat([rows, rows.assign(kind=ALL)], ignore_index=True)
    for (pair, kind), g in pooled.groupby(["pair", "kind"], sort=True):
        base = g[g.arm == "plain"]
        if base.empty:
            continue
        base_tps = float(base.tokens_per_s.mean())
        for config, a in g.groupby("config", sort=True):
            ratios = a.ratio_to_adjacent_plain.to_numpy()
            lo, hi = bootstrap_ci(ratios, np.median, **boot)
            out.append({"pair": pair, "category": kind, "config": config, "arm": a.arm.iloc[0],
                        "runs": len(a), "prompts": a.prompt_id.nunique(),
                        "tokens_per_s": float(a.tokens_per_s.mean()),
                        "speedup_spec_bench": float(a.tokens_per_s.mean()) / base_tps,
                        "speedup_speclab": float(np.median(ratios)), "speedup_lo": lo, "speedup_hi": hi,
                        "tokens_per_pass": float(a.tokens_per_pass.mean()) if config != "plain" else 1.0,
                        "alpha": float(a.acceptance_rate.mean()) if config != "plain" else np.nan,
                        "identical_share": float(a.identical_to_plain.mean())})
    return pd.DataFrame(out)


def plan_prompts(outputs_dir: str, campaign: str) -> pd.DataFrame:
    """Per pair: the prompts its latest plan calibrated on (the plan stage's prompt_ids)."""
    plan = read_plans(outputs_dir, campaign)
    if plan.empty:
        return pd.DataFrame(columns=["pair", "plan_prompts"])
    return latest_plan(plan).groupby("pair").prompt_ids.first().rename("plan_prompts").reset_index()


def recommendation_check(rows: pd.DataFrame, table: pd.DataFrame, plans: pd.DataFrame) -> pd.DataFrame:
    """Per pair and category: the recommended arm's speed-up on prompts the plan did not use, beside the best
    other arm of the same runs (picked after the fact) and the share of checked prompts that were held out."""
    out = []
    rec = table[table.arm == "recommended"]
    for r in rec.itertuples():
        used = set(plans.loc[plans.pair == r.pair, "plan_prompts"].str.split(",").sum() or [])
        sub = rows[(rows.pair == r.pair) & ((rows.kind == r.category) | (r.category == ALL)) & (rows.arm == "recommended")]
        others = table[(table.pair == r.pair) & (table.category == r.category) & ~table.arm.isin(["recommended", "plain"])]
        best = others.loc[others.speedup_speclab.idxmax()] if len(others) else None
        out.append({"pair": r.pair, "category": r.category, "chosen": ", ".join(sorted(set(config_label(sub)))),
                    "speedup_speclab": r.speedup_speclab, "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi,
                    "held_out_share": float((~sub.prompt_id.isin(used)).mean()) if len(sub) else np.nan,
                    "best_other": None if best is None else best.config,
                    "best_other_speedup": np.nan if best is None else best.speedup_speclab})
    return pd.DataFrame(out)


def metrics(table: pd.DataFrame) -> dict:
    """For ``dvc metrics``: per pair and category, plain tokens/s and the best arm by speclab's speed-up."""
    out: dict = {}
    for (pair, kind), g in table.groupby(["pair", "category"], sort=True):
        spec = g[g.arm != "plain"]
        entry = {"plain_tokens_per_s": float(g[g.arm == "plain"].tokens_per_s.iloc[0])}
        if len(spec):
            best = spec.loc[spec.speedup_speclab.idxmax()]
            entry.update(best_config=best.config, best_speedup_speclab=float(best.speedup_speclab),
                         best_speedup_spec_bench=float(best.speedup_spec_bench),
                         best_tokens_per_pass=float(best.tokens_per_pass),
                         identical_share=float(spec.identical_share.min()))
        out.setdefault(pair, {})[kind] = entry
    return out


def markdown(campaign: str, table: pd.DataFrame, check: pd.DataFrame, plans: pd.DataFrame, rows: pd.DataFrame) -> str:
    s = [f"## Spec-Bench workloads (campaign {campaign})\n"]
    if table.empty:
        s.append(f"Not measured: campaign {campaign!r} holds no speed runs on Spec-Bench's categories "
                 "(`python -m pipeline.run stage=speed prompts=spec_bench campaign=...`).\n")
        return "\n".join(s)
    s.append("Speed-up by Spec-Bench's definition (mean tokens/s of the arm over mean tokens/s of plain decoding) and "
             "by speclab's (median of within-block ratios to the adjacent plain run, 95% distribution-free interval); "
             "tokens per target pass = mean accepted tokens per pass; identical = share of runs equal to plain "
             "greedy. The best five arms per category by speclab's speed-up, and plain:\n")
    for pair, g in table.groupby("pair", sort=True):
        for kind, c in g.groupby("category", sort=True):
            top = pd.concat([c[c.arm == "plain"], c[c.arm != "plain"].nlargest(5, "speedup_speclab")])
            show = top.assign(interval=[f"{lo:.2f}-{hi:.2f}" if lo == lo else "" for lo, hi in
                                        zip(top.speedup_lo, top.speedup_hi)])
            s += [f"**{pair}, {kind}** ({int(c.prompts.max())} prompts)\n",
                  markdown_table(show[["config", "runs", "tokens_per_s", "speedup_spec_bench", "speedup_speclab",
                                       "interval", "tokens_per_pass", "alpha", "identical_share"]], ".2f"), ""]
    if not check.empty:
        s.append("The plan's recommendation on the categories' other prompts (held-out share: checked prompts the plan "
                 "did not calibrate on):\n")
        s += [markdown_table(check, ".2f"), ""]
        for r in plans.itertuples():
            checked = sorted(set(rows[(rows.pair == r.pair) & (rows.arm == "recommended")].prompt_id), key=str)
            s.append(f"- {r.pair}: the plan calibrated on prompts {r.plan_prompts}; the check ran on {', '.join(checked)}.")
        s.append("")
    s += [f"Reference ({LEADERBOARD_SOURCE}):\n", markdown_table(LEADERBOARD, ".2f"), ""]
    return "\n".join(s)


def main() -> None:
    params = load_params()
    campaign = params.get("spec_bench_campaign")
    if not campaign:
        raise AnalysisError("params.yaml names no spec_bench_campaign: add `spec_bench_campaign: <campaign>`")
    boot = bootstrap_settings(params)
    outputs = params["outputs_dir"]
    campaign_dir(outputs, campaign)
    speed = read_stage_if_any(outputs, "speed", campaign)
    if not speed.empty:
        speed = drop_drifted(speed, drift_table(speed, float(params["drift"]["max_ratio"])))
    rows = spec_bench_rows(speed) if not speed.empty else pd.DataFrame()
    table = category_table(rows, boot) if not rows.empty else pd.DataFrame()
    plans = plan_prompts(outputs, campaign)
    check = recommendation_check(rows, table, plans) if not table.empty else pd.DataFrame()
    text = markdown(campaign, table, check, plans, rows)
    out = Path(params["analysis_dir"])
    save_table(table, out / "spec_bench_table.parquet")
    save_table(check, out / "spec_bench" / "recommendation_check.parquet")
    save_json(metrics(table) if not table.empty else {}, Path(params["metrics_dir"]) / "detail" / "spec_bench.json")
    atomic_write_text(out / "spec_bench" / "section.md", text)
    print(text)


if __name__ == "__main__":
    run_script("analysis.spec_bench", main)
