"""A report section for a second campaign of other pairs (params.yaml: pair_campaign; issue 21).

    python -m analysis.pair_section     (reads outputs/campaigns/<pair_campaign>/, writes
                                         outputs/analysis/<pair_campaign>/*.csv, summary.json, section.md)

Per pair: step times and cost ratios (c_draft, c_verify at k = 1, 2, 4, 8) from the timing stage beside the
draft/target size ratios it records, and alpha per kind at each acceptance k. For the pairs with speed runs:
the best k per kind (median adjacent-run speed-up, 95% interval), the i.i.d. formula and the time model
against it, and the planner's check when the campaign has a plan. Every number comes from the campaign's
files through the same functions as the published analysis (analysis.fit, .breakeven, .drift, .time_model,
.recommend). A stage the campaign lacks (or the whole campaign, while it is being measured) is a line saying
so: the script never needs a stage to exist.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.breakeven import after_prompt, c_verify_for, cost_ratios
from analysis.common import (bootstrap_settings, load_params, markdown_table, read_stage_if_any, run_script, save_csv,
                             save_json)
from analysis.drift import drift_table, drop_drifted
from analysis.fit import acceptance_table, alpha_hat, formula_acceptance, formula_speed, speed_points
from analysis.inputs import AnalysisError, campaign_dir
from analysis.recommend import Recommendation, recommendation
from analysis.time_model import PREDICTORS, one_job_per_run, validate
from speclab.costs.time_model import iid_speedup
from store import layout
from store.files import atomic_write_text

STAGES = ("timing", "acceptance", "speed")
COMPARE_K = 4   # the drafts are compared by alpha at this k, on the prompts every pair was run on
VERIFY_KS = (1, 2, 4, 8)   # c_verify(k) reported at these k: a pass over k + 1 tokens over a 1-token step
SIZE_COLUMNS = [f"{role}_{what}" for role in ("target", "draft") for what in ("params", "bytes", "layers")]
NOT_MEASURED = "not measured in this campaign"
# c_draft "matches" a size ratio within this factor; beyond it the draft costs more (or less) than its size says.
CLOSE = 1.10


@dataclass
class CampaignData:
    """The stage rows of one campaign (an empty frame for a stage it lacks) and its stage file counts."""

    campaign: str
    timing: pd.DataFrame
    acc: pd.DataFrame
    speed: pd.DataFrame
    files: dict[str, int]
    rec: Recommendation | None = None


@dataclass
class PairSection:
    """Everything the section shows, as tables (also written as CSV) and the Markdown built from them."""

    campaign: str
    title: str
    costs: pd.DataFrame
    alpha: pd.DataFrame
    best: pd.DataFrame
    time_model: pd.DataFrame
    plan_check: pd.DataFrame
    drafts: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: dict[str, str] = field(default_factory=dict)   # why a part is missing, per part
    verdict: list[str] = field(default_factory=list)
    drift_excluded: int = 0


def read_campaign(outputs_dir: str | Path, campaign: str, boot: dict) -> CampaignData:
    """The campaign's timing, acceptance and speed rows and its latest plan; absent stages (or an absent
    campaign) are empty, never an error. A bad file still stops the script (analysis.inputs)."""
    campaign_dir(outputs_dir, campaign)  # validates the name
    files = {s: len(layout.stage_paths(outputs_dir, campaign, s)) for s in layout.STAGES}
    frames = {s: read_stage_if_any(outputs_dir, s, campaign) for s in STAGES}
    rec = recommendation(str(outputs_dir), campaign, boot) if files["plan"] else None
    return CampaignData(campaign, frames["timing"], frames["acceptance"], frames["speed"], files, rec)


def sizes(timing: pd.DataFrame) -> pd.DataFrame:
    """Per pair: both models' sizes as recorded (NaN where every timing file predates the columns)."""
    t = timing.assign(**{c: timing[c] if c in timing else np.nan for c in SIZE_COLUMNS})
    return t.groupby("pair")[SIZE_COLUMNS].first().astype(float)


def costs_table(timing: pd.DataFrame) -> pd.DataFrame:
    """Per pair: target and draft step (ms), c_draft = draft step / target step, c_verify(k) = target pass
    over k + 1 tokens / target step, and the draft/target ratios of parameters, weight bytes and layers."""
    costs = cost_ratios(after_prompt(timing))
    size = sizes(timing)
    rows = []
    for pair, c in costs.groupby("pair", sort=True):
        s = size.loc[pair]
        rows.append({"pair": pair, "target_step_ms": 1e3 * float(c.target_s[c.pass_len == 1].iloc[0]),
                     "draft_step_ms": 1e3 * float(c.draft_s.iloc[0]), "c_draft": float(c.c_draft.iloc[0]),
                     **{f"c_verify_k{k}": c_verify_for(c, k) for k in VERIFY_KS},
                     **s.to_dict(),
                     "params_ratio": s.draft_params / s.target_params, "bytes_ratio": s.draft_bytes / s.target_bytes,
                     "layer_ratio": s.draft_layers / s.target_layers})
    return pd.DataFrame(rows)


def alpha_long(acc: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair, kind (and all) and acceptance k: alpha = accepted / checked proposals (draft model, fixed k,
    greedy), from analysis.fit's acceptance table."""
    acc = formula_acceptance(acc)
    if acc.empty:
        return pd.DataFrame()
    return acceptance_table(acc, boot)[["pair", "kind", "k", "iterations", "alpha", "tokens_per_pass"]]


def drafts_table(costs: pd.DataFrame, acc: pd.DataFrame, k: int = COMPARE_K) -> pd.DataFrame:
    """The drafts side by side on equal terms: per pair, c_draft, the size ratios and alpha at ``k`` on the
    prompts every pair has a greedy fixed-k acceptance run for at that k, and the i.i.d. formula's speed-up
    at each k of ``VERIFY_KS`` from those (its best k and value). Empty when fewer than two pairs qualify."""
    acc = formula_acceptance(acc) if not acc.empty else acc
    if acc.empty or costs.empty:
        return pd.DataFrame()
    at_k = acc[(acc.k == k) & acc.pair.isin(costs.pair)]
    per_pair = at_k.groupby("pair").prompt_id.apply(set)
    if len(per_pair) < 2:
        return pd.DataFrame()
    common = set.intersection(*per_pair)
    if not common:
        return pd.DataFrame()
    rows = []
    for c in costs[costs.pair.isin(per_pair.index)].itertuples():
        # A prompt run by two jobs of one pair would otherwise count twice.
        g = one_job_per_run(at_k[(at_k.pair == c.pair) & at_k.prompt_id.isin(common)])
        alpha = alpha_hat(g)
        pred = {kk: iid_speedup(alpha, kk, c.c_draft, getattr(c, f"c_verify_k{kk}")) for kk in VERIFY_KS}
        best = max(pred, key=pred.get)
        rows.append({"pair": c.pair, "c_draft": c.c_draft, "bytes_ratio": c.bytes_ratio, "layer_ratio": c.layer_ratio,
                     f"alpha_k{k}": alpha, "prompts": len(common), "iid_best_k": best, "iid_best_speedup": pred[best]})
    return pd.DataFrame(rows).sort_values("iid_best_speedup", ascending=False, ignore_index=True)


def best_k(points: pd.DataFrame) -> pd.DataFrame:
    """Per pair and kind, the k with the highest median measured speed-up, with its interval and predictions."""
    if points.empty:
        return pd.DataFrame()
    idx = points.groupby(["pair", "kind"], sort=True).measured.idxmax()
    cols = ["pair", "kind", "k", "runs", "measured", "measured_lo", "measured_hi", "alpha", "predicted_iid",
            "predicted_empirical", "c_draft", "c_verify"]
    return points.loc[idx, cols].reset_index(drop=True)


def calibration_job_for(data: CampaignData, pair: str, params: dict) -> str | None:
    """The timing job the time model is calibrated on: the published time model's own when this is its
    campaign, else the pair's latest plan (its timing part: every sample prompt timed at two contexts and
    prefilled, beside the plan's acceptance runs). None without a plan: a timing job made for cost ratios
    (one prompt, after the prompt only) does not calibrate a model worth judging."""
    jobs = sorted(set(data.timing[data.timing.pair == pair].config_hash))
    if data.campaign == params.get("time_model", {}).get("campaign"):
        return params["time_model"].get("calibration_job")
    if data.rec is not None:
        plan = data.rec.plan[data.rec.plan.pair == pair]
        if len(plan) and plan.config_hash.iloc[0] in jobs:
            return str(plan.config_hash.iloc[0])
    return None


def time_model_rows(data: CampaignData, pair: str, best: pd.DataFrame, params: dict,
                    boot: dict) -> tuple[pd.DataFrame, str]:
    """The time model and the i.i.d. formula against the held-out measurement at each kind's best k, with
    each predictor's mean absolute error over every (kind, k); or no rows and why."""
    t, a, s = (df[df.pair == pair] if not df.empty else df for df in (data.timing, data.acc, data.speed))
    if t.empty or a.empty:
        return pd.DataFrame(), "needs timing and acceptance results"
    job = calibration_job_for(data, pair, params)
    if job is None:
        return pd.DataFrame(), "no plan of this pair in the campaign to calibrate it (+sweep=plan)"
    try:
        v = validate(t, a, s, job, data.campaign, boot)
    except AnalysisError as err:  # too little data for a model: said in the section, not a failed stage
        return pd.DataFrame(), str(err).removeprefix(f"campaign {data.campaign!r}: ")
    mae = v.errors[v.errors.kind == "every kind"].set_index("predictor").mae
    rows = []
    for r in best[best.pair == pair].itertuples():
        hit = v.points[(v.points.kind == r.kind) & (v.points.k == r.k)]
        if hit.empty:
            continue
        h = hit.iloc[0]
        rows.append({"pair": pair, "kind": r.kind, "k": int(r.k), "held_out_runs": int(h.runs),
                     "measured_held_out": h.measured, "measured_lo": h.measured_lo, "measured_hi": h.measured_hi,
                     "time_model": h.tm_own, "iid_formula": h.iid_own,
                     "time_model_mae_all_k": float(mae[PREDICTORS["tm_own"]]),
                     "iid_mae_all_k": float(mae[PREDICTORS["iid_own"]]), "calibration_job": job or ""})
    return pd.DataFrame(rows), "" if rows else "no held-out speed runs at the best k"


def plan_check_rows(rec: Recommendation | None) -> pd.DataFrame:
    """The planner's recommendation per pair and kind, and the pooled check rows (analysis.recommend)."""
    if rec is None or rec.check.empty:
        return pd.DataFrame()
    return rec.check[rec.check.kind == "all"][["check", "comparison", "config", "baseline", "blocks", "median_ratio",
                                               "ratio_lo", "ratio_hi", "goal", "met"]].reset_index(drop=True)


def cost_vs_size(row: pd.Series) -> str:
    """How c_draft compares with the weight-bytes and layer ratios of a pair, in words."""
    parts = []
    for name, ratio in (("weight-bytes ratio", row.bytes_ratio), ("layer ratio", row.layer_ratio)):
        if math.isnan(ratio):
            parts.append(f"the {name} is not measured")
            continue
        f = row.c_draft / ratio
        if 1 / CLOSE <= f <= CLOSE:
            parts.append(f"close to the {name} {ratio:.2f} (x{f:.2f})")
        else:
            parts.append(f"x{f:.2f} the {name} {ratio:.2f}: the draft step costs "
                         f"{'more' if f > 1 else 'less'} than that size ratio says")
    return f"{row.pair}: c_draft = {row.c_draft:.2f}; " + "; ".join(parts) + "."


def pays(row: pd.Series) -> str:
    if row.measured_lo != row.measured_lo:
        return "has too few runs for a verdict"
    if row.measured_lo > 1:
        return "pays"
    if row.measured_hi < 1:
        return "does not pay (loses)"
    return "is not distinguishable from plain decoding"


def verdict_lines(costs: pd.DataFrame, best: pd.DataFrame, plan_check: pd.DataFrame) -> list[str]:
    """The verdict in words: per pair and kind whether the draft pays at its best k, whether the plan's
    recommendation beat the best fixed configuration, and how each pair's c_draft compares with its size ratios."""
    out = []
    for _, r in best.iterrows():
        out.append(f"- {r.pair}, {r.kind}: the draft {pays(r)} at its best k = {int(r.k)}: "
                   + (f"x{r.measured:.3f} ({r.measured_lo:.3f}-{r.measured_hi:.3f}, 95% interval)."
                      if r.measured_lo == r.measured_lo else f"x{r.measured:.3f} ({int(r.runs)} runs, no interval)."))
    for _, r in plan_check[plan_check.blocks > 0].iterrows() if not plan_check.empty else ():
        side = ("a tie" if r.ratio_lo <= r.goal <= r.ratio_hi else
                "above the goal" if r.median_ratio > r.goal else "below the goal")
        out.append(f"- Planner, {r.check} check, {r.comparison}: x{r.median_ratio:.3f} "
                   f"({r.ratio_lo:.3f}-{r.ratio_hi:.3f}) over {int(r.blocks)} blocks, {side} ({r.goal:g}).")
    for _, r in costs.iterrows():
        out.append(f"- {cost_vs_size(r)}")
    return out


def pair_label(target: str, draft: str) -> str:
    """'<target> drafted by <draft>'; a draft derived from the target's weights (int8, bf16, layers:N) is its copy."""
    derived = "-" not in draft and "/" not in draft
    return f"{target} drafted by " + (f"its own {draft} copy" if derived else draft)


def title_for(data: CampaignData) -> str:
    """The section's title from the campaign's own rows: the pair with the most speed runs (else timing)."""
    for df in (data.speed, data.timing, data.acc):
        if not df.empty:
            main = df.groupby("pair").size().sort_index().idxmax()
            r = df[df.pair == main].iloc[0]
            return f"{pair_label(str(r.target), str(r.draft))} (campaign {data.campaign})"
    return f"Pair campaign {data.campaign} (not measured yet)"


def build(data: CampaignData, params: dict, boot: dict) -> PairSection:
    sec = PairSection(data.campaign, title_for(data), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                      pd.DataFrame(), plan_check_rows(data.rec))
    if not data.timing.empty:
        sec.costs = costs_table(data.timing)
    if not data.acc.empty:
        sec.alpha = alpha_long(data.acc, boot)
        sec.drafts = drafts_table(sec.costs, data.acc)
    acc_rows = formula_acceptance(data.acc) if not data.acc.empty else data.acc
    speed = formula_speed(data.speed) if not data.speed.empty else data.speed
    if not speed.empty and params["drift"]["exclude"]:
        drift = drift_table(speed, float(params["drift"]["max_ratio"]))
        sec.drift_excluded = int(drift.flagged.sum())
        speed = drop_drifted(speed, drift)
    if not speed.empty and (speed.arm == "speculative").any():
        alpha_tab = acceptance_table(acc_rows, boot) if not acc_rows.empty else pd.DataFrame(
            columns=["pair", "kind", "k", "alpha", "tokens_per_pass", "iterations"])
        sec.best = best_k(speed_points(speed, alpha_tab, boot))
        tm = [time_model_rows(data, pair, sec.best, params, boot) for pair in sorted(sec.best.pair.unique())]
        sec.time_model = pd.concat([t for t, _ in tm if not t.empty], ignore_index=True) if any(
            not t.empty for t, _ in tm) else pd.DataFrame()
        sec.notes["time_model"] = "; ".join(f"{p}: {why}" for p, (_, why) in zip(sorted(sec.best.pair.unique()), tm)
                                            if why)
    sec.verdict = verdict_lines(sec.costs, sec.best, sec.plan_check)
    return sec


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Size columns as shown: numbers where recorded, "not measured" where every timing file predates them."""
    shown = df.astype(object)
    for col in df.columns[1:]:
        shown[col] = [f"{v:.3f}" if v == v else "not measured" for v in df[col].astype(float)]
    return shown


def _alpha_wide(alpha: pd.DataFrame) -> pd.DataFrame:
    wide = alpha.pivot_table(index=["pair", "kind"], columns="k", values="alpha", sort=True)
    wide.columns = [f"alpha k={k}" for k in wide.columns]
    return wide.reset_index()


def markdown(sec: PairSection, data: CampaignData) -> str:
    present = ", ".join(f"{s} {n}" for s, n in data.files.items() if n) or "none"
    s = [f"## {sec.title}\n",
         f"Campaign `{sec.campaign}` (`params.yaml: pair_campaign`), read from `outputs/campaigns/{sec.campaign}/` "
         f"(stage files: {present}); tables in `outputs/analysis/{sec.campaign}/`. Same definitions as above: "
         "speed-ups are medians of adjacent-run ratios, alpha is accepted / checked proposals (draft model, "
         "fixed k, greedy).\n",
         "### Costs and sizes per pair\n"]
    if sec.costs.empty:
        s.append(f"Timing: {NOT_MEASURED}.\n")
    else:
        c = sec.costs.assign(**{f"{r}_MB": sec.costs[f"{r}_bytes"] / 1e6 for r in ("target", "draft")},
                             **{f"{r}_params_M": sec.costs[f"{r}_params"] / 1e6 for r in ("target", "draft")})
        s += ["Step times after the prompt (median over prompts and runs); `c_draft` = draft step / target step, "
              "`c_verify_k<k>` = target pass over k + 1 tokens / target step; sizes as held in memory (int8 "
              "weights counted in their packed form); ratios are draft / target (not measured: timing files "
              "written before the sizes were recorded).\n",
              markdown_table(c[["pair", "target_step_ms", "draft_step_ms", "c_draft",
                                *[f"c_verify_k{k}" for k in VERIFY_KS]]]), "",
              markdown_table(not_measured(c[["pair", "target_params_M", "draft_params_M", "target_MB", "draft_MB",
                                             "target_layers", "draft_layers", "params_ratio", "bytes_ratio",
                                             "layer_ratio"]])), ""]
    s.append("### Acceptance per kind\n")
    s += [f"Acceptance: {NOT_MEASURED}.\n"] if sec.alpha.empty else [
        "alpha = accepted / checked proposals at each k of the acceptance stage (`all`: kinds pooled).\n",
        markdown_table(_alpha_wide(sec.alpha)), ""]
    if not sec.drafts.empty:
        s += [f"Drafts compared on equal terms: alpha at k = {COMPARE_K} on the {int(sec.drafts.prompts.iloc[0])} "
              "prompts every pair was run on, and the i.i.d. formula's best k (of "
              f"{', '.join(map(str, VERIFY_KS))}) and speed-up from that alpha, c_draft and c_verify(k); "
              "fastest first.\n", markdown_table(sec.drafts.drop(columns="prompts")), ""]
    s.append("### Speed: best k per kind, predicted vs measured\n")
    if sec.best.empty:
        s.append(f"Speed: {NOT_MEASURED}.\n" if data.speed.empty else
                 "Speed: no greedy fixed-k runs of the draft model in this campaign (other arms only).\n")
    else:
        drifted = f"; {sec.drift_excluded} drifted speed job(s) left out" if sec.drift_excluded else ""
        s += [f"Measured: median speed-up over the adjacent plain run at the k with the highest median, 95% "
              f"distribution-free interval (`measured_lo`-`measured_hi`){drifted}. "
              "`predicted_iid`: the i.i.d. formula at alpha with the speed jobs' own step times; "
              "`predicted_empirical`: measured tokens per pass plus per-iteration overhead (analysis.fit).\n",
              markdown_table(sec.best), ""]
        if sec.time_model.empty:
            s.append(f"Time model: not available ({sec.notes.get('time_model') or NOT_MEASURED}).\n")
        else:
            s += ["The time model (calibrated on the timing job named, analysis.time_model) and the i.i.d. formula "
                  "on the prompts held out of its calibration, at the same kind and k; `*_mae_all_k`: each "
                  "predictor's mean absolute error over every kind and k measured.\n",
                  markdown_table(sec.time_model), ""]
            if sec.notes.get("time_model"):
                s.append(f"Time model not available for {sec.notes['time_model']}.\n")
    s.append("### The planner's check\n")
    if data.rec is None:
        s.append(f"Plan: {NOT_MEASURED}.\n")
    else:
        rec = data.rec.plan[data.rec.plan.recommended]
        s += ["Recommended per kind by the campaign's latest plan (analysis.recommend):\n",
              markdown_table(rec[[c for c in ["pair", "kind", "drafter", "k_policy", "k", "predicted", "predicted_lo",
                                              "predicted_hi", "predicted_iid"] if c in rec]]), ""]
        s += [f"Check runs (`+sweep=check_plan` / `confirm_plan`): {NOT_MEASURED}.\n"] if sec.plan_check.empty else [
            "Check in adjacent runs, kinds pooled (median of within-block tokens/s ratios, 95% interval; `met`: "
            "median at or above the goal):\n", markdown_table(sec.plan_check), ""]
    s.append("### Verdict\n")
    s += (sec.verdict + [""]) if sec.verdict else [f"Nothing to judge: {NOT_MEASURED}.\n"]
    return "\n".join(s)


def _clean(value):
    """JSON-safe: NaN as null, numpy scalars as Python numbers."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    return value


def summary(sec: PairSection) -> dict:
    out: dict = {"campaign": sec.campaign, "title": sec.title, "pairs": {}}
    for r in sec.costs.to_dict("records"):
        out["pairs"].setdefault(r["pair"], {}).update(
            {k: _clean(r[k]) for k in ("target_step_ms", "draft_step_ms", "c_draft", "bytes_ratio", "layer_ratio")})
    for r in sec.best.to_dict("records"):
        p = out["pairs"].setdefault(r["pair"], {})
        p.setdefault("best_k", {})[r["kind"]] = int(r["k"])
        p.setdefault("speedup_at_best_k", {})[r["kind"]] = _clean(r["measured"])
        p.setdefault("pays", {})[r["kind"]] = bool(r["measured_lo"] > 1)
    return out


def main() -> None:
    params = load_params()
    campaign = params.get("pair_campaign")
    if not campaign:
        raise AnalysisError("params.yaml names no pair_campaign: add `pair_campaign: <campaign>`")
    boot = bootstrap_settings(params)
    data = read_campaign(params["outputs_dir"], campaign, boot)
    sec = build(data, params, boot)
    text = markdown(sec, data)
    out = Path(params["analysis_dir"]) / campaign
    # Everything is computed; only now are outputs replaced (each atomically).
    for name, df in (("costs", sec.costs), ("alpha", sec.alpha), ("drafts", sec.drafts), ("best_k", sec.best),
                     ("time_model", sec.time_model), ("plan_check", sec.plan_check)):
        save_csv(df, out / f"{name}.csv")
    save_json(summary(sec), out / "summary.json")
    atomic_write_text(out / "section.md", text)
    print(text)


if __name__ == "__main__":
    run_script("analysis.pair_section", main)
