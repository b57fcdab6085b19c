"""The report's findings in words: sentences and small derived tables computed from the analysis tables.

The templates (analysis/templates/) lay them out; nothing here knows where a sentence is shown.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.answer import Answer


def _measure(v: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    return f"x{v:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if lo == lo and hi == hi else "")


def why_numbers_differ(ans: Answer | None, t: dict[str, pd.DataFrame], tree_arms: pd.DataFrame,
                       campaign: str, trees_campaign: str | None, k: int = 4) -> str:
    """The draft model at ``k`` of the published pair as each section measured it (campaign, stage, days,
    commit, design), or "" where no two sections measured it."""
    if ans is None or ans.provenance.empty:
        return ""
    prov = ans.provenance.set_index(["campaign", "stage"])

    def when(name: str | None, stage: str) -> str:
        if (name, stage) not in prov.index:
            return f"campaign {name}"
        p = prov.loc[(name, stage)]
        day = p.first_day if p.first_day == p.last_day else f"{p.first_day} to {p.last_day}"
        return f"campaign {name}, {stage} stage, {day}, commit {p.commits.split(',')[-1]}"

    points, batch, ranking = t["speed_points"], t["batch_speedups"], t["recommendation_ranking"]
    cal = t["time_model_calibration"]
    pair = str(points.pair.iloc[0]) if not points.empty else None
    seen = []
    p = points[(points.kind == "all") & (points.k == k)] if pair else points
    if len(p):
        r = p.iloc[0]
        seen.append(f"{_measure(r.measured, r.measured_lo, r.measured_hi)} in *Speed* and the verdict "
                    f"({when(campaign, 'speed')}: one configuration per job, each run beside its adjacent plain run)")
    b = batch[(batch.batch_size == 1) & (batch.k == k) & (batch.pair == pair)] if len(batch) else batch
    if len(b):
        r = b.iloc[0]
        seen.append(f"{_measure(r.measured, r.measured_lo, r.measured_hi)} at B = 1 in *Batches* "
                    f"({when(campaign, 'batch')}: the batched loop, with its masks and padding, against batched plain)")
    rk = ranking[ranking.config == f"speculative model k={k}"] if len(ranking) else ranking
    if len(rk) and not cal.empty:
        r, tm = rk.iloc[0], str(cal.campaign.iloc[0])
        check = t["recommendation_check"]
        explo = check[check.check == "exploratory"].arms_per_block if "arms_per_block" in check else pd.Series([])
        arms = f"{explo.iloc[0]:.0f} arms per block" if len(explo) else "many arms per block"
        seen.append(f"{_measure(r.speedup)} in the planner's exploratory check ({when(tm, 'speed')}: {arms}, so a "
                    "run is several runs away from its block's plain run, with the machine's drift in between)")
    tr = tree_arms[(tree_arms.pair == pair) & (tree_arms.kind == "all") & (tree_arms.config == f"chain model k={k}")] \
        if len(tree_arms) else tree_arms
    if len(tr):
        r = tr.iloc[0]
        seen.append(f"{_measure(r.speedup, r.speedup_lo, r.speedup_hi)} in *Tree-shaped drafts* "
                    f"({when(trees_campaign, 'speed')}: chains and trees rotated in one block)")
    if not seen:
        return ""
    return (f"The draft model at k = {k} on {pair}: " + "; ".join(seen) + ".")


def drift_sentence(drift: pd.DataFrame, max_ratio: float, exclude: bool) -> str:
    n = int(drift.flagged.sum())
    return (f"{n} of {len(drift)} speed jobs had before/after step times differing by more than x{max_ratio}"
            + (" and were excluded from the fits." if exclude else " (kept in the fits)."))


def time_model_goals(errors: pd.DataFrame) -> pd.DataFrame:
    """Each time-model variant against the goal, beside the i.i.d. formula priced the same way."""
    every = errors[errors.kind == "every kind"].set_index("predictor")
    rows = []
    for tm, iid in (("time model, own acceptance", "i.i.d. formula, own acceptance"),
                    ("time model, own acceptance, at each block's step times",
                     "i.i.d. formula, own acceptance, at each block's step times"),
                    ("time model, kind sample", "i.i.d. formula, kind sample")):
        if tm not in every.index or not every.loc[tm, "points"]:
            continue
        a, b = every.loc[tm], every.loc[iid]
        rows.append({"predictor": tm, "points": int(a.points), "max_abs_error": a.max_abs_error, "mae": a.mae,
                     "iid_mae": b.mae, "mae_over_iid": a.mae / b.mae,
                     "met": bool(a.max_abs_error <= 0.05 and a.mae < 0.5 * b.mae)})
    return pd.DataFrame(rows)


def exercise4_paragraph(ex4: pd.DataFrame, dec: pd.DataFrame) -> str:
    """The chapter's exercise 4 in plain words at k = 6 (or the largest k), or "" without code and prose."""
    show = ex4[ex4.kind != "all"]
    at = show[show.k == (6 if (show.k == 6).any() else show.k.max())].set_index("kind")
    if not {"code", "prose"} <= set(at.index):
        return ""
    code, prose = at.loc["code"], at.loc["prose"]
    over = {kd: r.tokens_factor * r.iteration_factor for kd, r in at.iterrows()}
    d = dec[(dec.source == "predicted") & (dec.kind == "code") & (dec.k == code.k)] if not dec.empty else dec
    catch_up = (f"{100 * (d.catch_up_ms / (d.catch_up_ms + d.draft_steps_ms)).iloc[0]:.1f}%" if len(d)
                else "a share")
    main = "tokens per pass" if abs(np.log(code.tokens_factor)) >= abs(np.log(code.iteration_factor)) \
        else "the time of an iteration"
    return (
        f"In plain words, at k = {int(code.k)}: the formula's throughput for code is off by x{over['code']:.2f} "
        f"(prose x{over['prose']:.2f}), and the larger part of it is {main}. Code's alpha is {code.alpha:.2f} "
        f"against prose's {prose.alpha:.2f}, but its acceptances come in runs: {100 * code.bonus_share:.0f}% of "
        f"its iterations accept every proposal (prose {100 * prose.bonus_share:.0f}%), with the rejections "
        f"clustered in between, so one alpha does not describe it: the formula turns alpha into "
        f"{code.tokens_per_pass_formula:.2f} tokens per pass where the runs produced {code.tokens_per_pass:.2f} "
        f"(x{code.tokens_factor:.2f}; prose x{prose.tokens_factor:.2f}). And an iteration does not cost k draft "
        f"steps and one check: {code.iteration_ms:.0f} ms measured against {code.iteration_ms_formula:.0f} ms "
        f"(x{code.iteration_factor:.2f}; prose x{prose.iteration_factor:.2f}): the draft's calls run at "
        f"{code.draft_ms_per_iter:.0f} ms per iteration against k steps' {code.draft_ms_formula:.0f} ms (every "
        f"all-accepted iteration makes the next first call a 2-token catch-up: {catch_up} of the predicted draft "
        f"time here), the check runs at the output's growing context, and the loop has its own per-iteration work. "
        f"Prefills (both models) are a further {100 * code.prefill_share:.0f}% of a code run that the formula "
        f"does not count. The time model replays the recorded iterations with these costs instead of averaging "
        f"them into one alpha and one step time; its errors are in the table above, next to the formula's.")


def best_fixed_verdict(check: pd.DataFrame) -> list[str]:
    """Per check design, in words: recommended vs the best fixed configuration, pooled and where the plan
    chose something else."""
    rows = check[check.comparison == "recommended vs best fixed"]
    out = []
    for design, g in rows.groupby("check", sort=False):
        pooled = g[g.kind == "all"].iloc[0]
        stale = int(pooled.get("other_plan_blocks", 0) or 0)
        left_out = (f" ({stale} blocks that ran an earlier plan's choice are left out)" if stale else "")
        if not pooled.blocks:
            out.append(f"**{design.capitalize()}**: no runs of the latest plan's recommendation{left_out}.")
            continue
        tie = pooled.ratio_lo <= pooled.goal <= pooled.ratio_hi
        verdict = "a tie at this number of blocks" if tie else ("above" if pooled.median_ratio > pooled.goal else "below")
        diff = g[(g.kind != "all") & (g.config != g.baseline)]
        own = "; ".join(f"{r.kind} ran {r.config.replace('speculative ', '')}: {r.median_ratio:.3f} "
                        f"({r.ratio_lo:.3f}-{r.ratio_hi:.3f})" for r in diff.itertuples())
        out.append(f"**{design.capitalize()}**: recommended vs {pooled.baseline.replace('speculative ', '')} "
                   f"(chosen {pooled.baseline_chosen}), {int(pooled.blocks)} blocks{left_out}, "
                   f"{pooled.runs_apart:.0f} run{'' if pooled.runs_apart == 1 else 's'} apart: "
                   f"median ratio {pooled.median_ratio:.3f} ({pooled.ratio_lo:.3f}-{pooled.ratio_hi:.3f}), {verdict}. "
                   + (f"Where the plan chose another configuration: {own}. " if own else
                      "The plan chose the baseline's configuration for every kind. ")
                   + (f"Where it chose the same one ({int(pooled.same_config_blocks)} blocks), the ratio of two runs "
                      f"of one configuration has IQR {pooled.same_config_q25:.3f}-{pooled.same_config_q75:.3f}: "
                      f"this design's noise floor." if pooled.same_config_blocks else ""))
    return out


# The planner's check as the report shows it (the full table: outputs/analysis/report_tables/planner_check.csv).
CHECK_COLUMNS = ["check", "comparison", "kind", "config", "baseline", "blocks", "runs_apart", "median_ratio", "ratio_lo",
                 "ratio_hi", "goal", "met"]


def shown_check(check: pd.DataFrame) -> pd.DataFrame:
    """The check's rows that hold a comparison (a design without runs of the latest plan's recommendation has
    none: the verdict line says so), in the columns a reader needs."""
    return check[check.blocks > 0][[c for c in CHECK_COLUMNS if c in check]]


def batch_exercise7(costs: pd.DataFrame, speed: pd.DataFrame) -> str:
    """Exercise 7 of the chapter from the batch stage: where the pass stops being flat, and where
    speculation stops paying, per batch size (one sentence, without its full stop)."""
    flat = []
    for b, sub in costs.groupby("batch_size"):
        sub = sub.sort_values("pass_len")
        over = sub[sub.c_verify > 1.25]
        # the flat stretch: pass lengths up to the first one that costs more than 1.25 one-token steps
        n_flat = int(sub.pass_len[sub.pass_len < over.pass_len.min()].max()) if len(over) else int(sub.pass_len.max())
        flat.append(f"B = {b}: flat up to {n_flat} new tokens per row ({b * n_flat} tokens in the pass)"
                    + ("" if len(over) else ", the longest pass measured"))
    best = speed.loc[speed.groupby("batch_size").measured.idxmax()]
    losing = best[best.measured_hi < 1.0]
    paying = best[best.measured_lo > 1.0]
    verdict = (f"even the best k loses (its whole interval below 1) at B = {', '.join(str(b) for b in losing.batch_size)}"
               if len(losing) else "no batch size measured has the best k's whole interval below 1")
    be = speed.groupby("batch_size").break_even_alpha.min()
    trend = ("rises" if be.iloc[-1] > be.iloc[0] else "falls" if be.iloc[-1] < be.iloc[0] else "stays")
    return ("Where the pass stops being flat (within 1.25 one-token steps at the same B): " + "; ".join(flat)
            + ". Best measured speed-up per B: "
            + ", ".join(f"B = {r.batch_size}: x{r.measured:.2f} at k = {r.k}" for r in best.itertuples())
            + f"; {verdict}" + (f"; it clearly pays (interval above 1) at B = {', '.join(str(b) for b in paying.batch_size)}"
                               if len(paying) else "")
            + f". The lowest break-even alpha over k {trend} from {be.iloc[0]:.2f} at B = {be.index[0]} to "
            f"{be.iloc[-1]:.2f} at B = {be.index[-1]}")


def batch_model_verdict(errors: pd.DataFrame) -> str:
    """Whether the time model's error at B is below half the formula's, or "" without predictions."""
    if errors.empty or errors.time_model_mae.isna().all():
        return ""
    half, missing = errors.time_model_mae < errors.formula_mae / 2, errors.time_model_mae.isna()
    verdict = ("below half the formula's at every B" if half.all() else
               "NOT below half the formula's at B = " + ", ".join(str(b) for b in errors.batch_size[~half & ~missing])
               if (~half & ~missing).any() else "below half the formula's at every B it predicts")
    if missing.any():
        verdict += " (no prediction at B = " + ", ".join(str(b) for b in errors.batch_size[missing]) + ")"
    return verdict


def candidates(ans: Answer | None, top: int = 3) -> pd.DataFrame:
    """The configurations the answer chose between: the best ``top`` per campaign, pair and kind (greedy)."""
    if ans is None or ans.candidates.empty:
        return pd.DataFrame()
    c = ans.candidates[ans.candidates.sampling == "greedy"]
    return c.groupby(["campaign", "pair", "kind"], sort=False).head(top)


def jobs_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per pooled stage file: the date it finished and the short commit."""
    return pd.DataFrame({"campaign": jobs.campaign, "stage": jobs.stage, "pair": jobs.pair,
                         "config_hash": jobs.config_hash, "rows": jobs.rows,
                         "finished": jobs.finished_at.fillna("").str[:10],
                         "commit": jobs.git_commit.fillna("").str[:7]})


def jobs_notes(jobs: pd.DataFrame) -> list[str]:
    return [f"{n} of these jobs: {note}." for note, n in jobs.note.dropna().value_counts(sort=False).items()]
