"""The Markdown report: figures and tables of the analysis, with the verdict per kind.

    python -m analysis.report     (reads outputs/analysis/*.parquet, writes outputs/report.md)
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.answer import Answer, per_campaign, read_answer, render
from analysis.common import load_params, markdown_table, published_campaign, read_table, run_script, save_csv
from analysis.inputs import AnalysisError, campaign_dir
from store.files import atomic_write_text

# Full tables of the report's cut ones (outputs/analysis/report_tables/<name>.csv) and the appendix file.
FULL_TABLES = "report_tables"
APPENDIX = "report_appendix.md"


# One line under each figure: what it shows and how to read it (README's figures carry the same captions).
CAPTIONS = {
    "step_time_vs_pass_length.png": "Median pass time of the target and the draft against the number of new tokens "
                                    "in the pass (after the prompt); c_verify(k) is the target's time at k+1 tokens "
                                    "over its time at 1.",
    "speedup_map.png": "Predicted speed-up over (alpha, k) from the measured costs (c_draft = draft step / target "
                       "step, c_verify = verification pass / target step): blue wins, red loses, the black line is "
                       "break-even; dots are each kind's measured alpha at its best measured k.",
    "alpha_by_k.png": "Acceptance rate (accepted / checked proposals) per kind at each k; flat lines mean alpha is a "
                      "property of text and pair, not of k.",
    "tokens_per_pass.png": "Tokens per target pass, measured (solid) against the i.i.d. formula (dashed); a measured "
                           "line below the dashed one means acceptances cluster (not independent).",
    "speedup_predicted_vs_measured.png": "Measured speed-up (median over adjacent-run ratios, 95% bootstrap "
                                         "interval) against both predictors, per kind and k; 1.0 = plain decoding.",
    "strategies.png": "Per kind (fastest first): the draft model's best fixed k, the two adaptive k policies and "
                      "prompt lookup's best fixed k, median speed-up with 95% bootstrap interval; overlapping "
                      "intervals are a tie (the best fixed k is picked after the fact, so it is optimistic).",
    "sampled_alpha.png": "Acceptance rate per kind under greedy and sampled decoding, over the k measured in every "
                         "setting; sampling lowers alpha because the draft must match a distribution, not an arg-max.",
    "time_model_speedup.png": "Held-out prompts: measured speed-up (median of adjacent-run ratios, 95% bootstrap "
                              "interval) against the time model (replaying each prompt's own acceptance run, with "
                              "the interval over prompts; and replaying the calibration prompts of the same kind) "
                              "and the i.i.d. formula, per kind and k.",
    "time_model_decomposition.png": "Milliseconds per generated token by part: predicted by the time model (left, "
                                    "hatched) and measured by the loop's stopwatches in the speed runs (right); the "
                                    "measured draft bar includes the catch-up, which only the model can separate.",
    "drift.png": "Step times taken before against after each speed job; points outside the grey band (flagged "
                 "crosses) changed speed mid-job and are left out of the fits.",
    "distribution_rejections.png": "Share of distribution tests rejected at p < 0.01 (left) and the simulated power "
                                   "against the wrong rules (right): the correct rule should be rejected about 1% "
                                   "of the time, the wrong ones always.",
}


def _fig(figs: Path, report: Path, name: str, caption: str) -> str:
    path = figs / name
    if not path.exists():
        return f"_{caption}: figure not produced (its stage has no results yet)_\n"
    text = f"![{caption}]({os.path.relpath(path, report.parent)})\n"
    return text + (f"\n*{CAPTIONS[name]}*\n" if name in CAPTIONS else "")


def read_jobs(params: dict) -> pd.DataFrame:
    """The jobs table of the published campaign (analysis.jobs); required, and of that campaign only."""
    campaign, path = published_campaign(params), Path(params["analysis_dir"]) / "jobs.parquet"
    jobs = read_table(params["analysis_dir"], "jobs")
    # Without it the report could not say which runs it stands on; a stale one would say the wrong thing.
    if jobs.empty:
        raise AnalysisError(f"{path} is missing or empty; run `python -m analysis.jobs` (or `dvc repro`)")
    if set(jobs.campaign) != {campaign}:
        raise AnalysisError(f"{path} lists campaign(s) {sorted(set(jobs.campaign))}, not the published "
                            f"{campaign!r}; run `python -m analysis.jobs` (or `dvc repro`)")
    return jobs


def jobs_section(jobs: pd.DataFrame, campaign: str) -> list[str]:
    """One row per pooled stage file: date it finished and the short commit, plus any provenance notes."""
    s = [f"## Jobs pooled (campaign {campaign})\n",
         f"One row per stage file of campaign `{campaign}`, from the provenance record the pipeline wrote into "
         "it (`finished`: date the job ended; `commit`: the code it ran).\n"]
    for note, n in jobs.note.dropna().value_counts(sort=False).items():
        s.append(f"{n} of these jobs: {note}.\n")
    table = pd.DataFrame({"campaign": jobs.campaign, "stage": jobs.stage, "pair": jobs.pair,
                          "config_hash": jobs.config_hash, "rows": jobs.rows,
                          "finished": jobs.finished_at.fillna("").str[:10],
                          "commit": jobs.git_commit.fillna("").str[:7]})
    return s + [markdown_table(table), ""]


def build_report(params: dict) -> str:
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    report = Path(params["outputs_dir"]) / "report.md"
    campaign, jobs = published_campaign(params), read_jobs(params)
    t = {name: read_table(out, name) for name in (
        "acceptance_table", "speed_points", "predictor_errors", "drift", "breakeven", "best_k", "divergence_counts",
        "divergences", "distribution_rates", "distribution_tests", "drafter_comparison", "adaptive_vs_fixed",
        "sampled_alpha", "strategy_comparison", "batch_costs", "batch_speedups", "batch_model_error", "time_model_points",
        "time_model_errors", "time_model_decomposition", "time_model_exercise4", "time_model_calibration",
        "recommendation", "recommendation_check", "recommendation_ranking")}
    acc, points, errors = t["acceptance_table"], t["speed_points"], t["predictor_errors"]
    drift, be, best = t["drift"], t["breakeven"], t["best_k"]
    div_counts, divs = t["divergence_counts"], t["divergences"]
    rates, tests = t["distribution_rates"], t["distribution_tests"]
    drafters, adaptive, sampled = t["drafter_comparison"], t["adaptive_vs_fixed"], t["sampled_alpha"]
    comparison = t["strategy_comparison"]
    ans = read_answer(out)
    s = ["# speclab report\n", *answer_section(ans),
         *why_numbers_differ(ans, t, read_table(out / "trees", "arms"), params),
         "## The sections below\n",
         f"Campaign: **{campaign}** (`params.yaml: campaign`) unless a heading names another. Generated by `dvc repro` from the {len(jobs)} "
         f"Parquet results under `outputs/campaigns/{campaign}/<stage>/`, listed under "
         f"[Jobs pooled](#jobs-pooled-campaign-{campaign}); results of other campaigns are not read. Speed-ups are medians "
         "of each speculative run's tokens/s divided by the adjacent plain run's; predictions use step times "
         "taken before and after each speed job.\n"]
    if not best.empty:
        s += [f"## Verdict: the draft model's best k per kind (campaign {campaign})\n", markdown_table(best), ""]
    s += [f"## Step and pass times (campaign {campaign})\n", _fig(figs, report, "step_time_vs_pass_length.png", "step time vs pass length")]
    if not be.empty:
        s += ["Break-even acceptance rate per k (speculation loses below it). Costs are in target steps: "
              "`c_draft` = draft step / target step, `c_verify` = target pass over the k+1 verified tokens / "
              "target step.\n",
              markdown_table(be[["pair", "k", "c_draft", "c_verify", "break_even_alpha"]]), ""]
    s.append(_fig(figs, report, "speedup_map.png", "predicted speed-up map"))
    s += [f"## Acceptance (campaign {campaign})\n", _fig(figs, report, "alpha_by_k.png", "alpha per kind vs k"),
          _fig(figs, report, "tokens_per_pass.png", "tokens per pass vs formula")]
    if not acc.empty:
        s += ["alpha is accepted / checked proposals (the first rejection ends the check). `formula_iid` is "
              "(1 - a^(k+1))/(1 - a) with the pooled alpha; `formula_prompt_mixture` averages it over the "
              "per-prompt alphas (acceptance is not independent between positions).\n",
              markdown_table(acc[["pair", "kind", "k", "iterations", "alpha", "proposal_efficiency",
                                  "tokens_per_pass", "formula_iid", "formula_prompt_mixture"]]), ""]
    s += [f"## Speed: predicted vs measured (campaign {campaign})\n",
          _fig(figs, report, "speedup_predicted_vs_measured.png", "predicted vs measured speed-up")]
    if not points.empty:
        s += ["`c_draft` and `c_verify` here are the speed jobs' own step times (draft step / target step, "
              "verification pass / target step, averaged before and after each job).\n",
              markdown_table(points[["pair", "kind", "k", "runs", "measured", "measured_lo", "measured_hi",
                                     "predicted_iid", "predicted_empirical", "alpha", "c_draft", "c_verify"]]), "",
              "Mean absolute error of each predictor against the measured speed-up:\n", markdown_table(errors), ""]
    s += time_model_section(t, figs, report)
    cal = t["time_model_calibration"]
    s += planner_section(t, str(cal.campaign.iloc[0]) if not cal.empty else None)
    s += [f"## Drafters and k policies (campaign {campaign})\n", _fig(figs, report, "strategies.png", "adaptive vs best fixed k")]
    if not comparison.empty:
        s += ["Adaptive k against the best fixed k, greedy (the points of the figure; `speedup_lo`/`_hi`: 95% "
              "bootstrap interval of the median):\n",
              markdown_table(comparison[["pair", "kind", "strategy", "k", "mean_k", "runs", "speedup", "speedup_lo",
                                         "speedup_hi"]]), ""]
    if not drafters.empty:
        s += ["Best fixed-k speed-up of each drafter per kind (prompt lookup needs no draft model):\n",
              markdown_table(drafters), ""]
    if not adaptive.empty:
        s += ["Adaptive k against the best fixed k of the same jobs (adjacent runs):\n", markdown_table(adaptive), ""]
    s += [f"## Sampling: acceptance against greedy (campaign {campaign})\n", _fig(figs, report, "sampled_alpha.png", "sampled alpha")]
    if not sampled.empty:
        s += [markdown_table(sampled[sampled.kind == "all"]), ""]
    s += [f"## Drift (campaign {campaign})\n", _fig(figs, report, "drift.png", "drift")]
    if not drift.empty:
        n = int(drift.flagged.sum())
        s += [f"{n} of {len(drift)} speed jobs had before/after step times differing by more than "
              f"x{params['drift']['max_ratio']}" + (" and were excluded from the fits." if params["drift"]["exclude"]
                                                   else " (kept in the fits).") + "\n",
              markdown_table(drift[["pair", "kinds", "rounds", "target_step_before_s", "target_step_after_s",
                                    "draft_step_before_s", "draft_step_after_s", "drift_ratio", "flagged"]],
                             ".4f"), ""]
    s += [f"## Greedy correctness: divergences (campaign {campaign})\n"]
    if not div_counts.empty:
        s += [markdown_table(div_counts), "", markdown_table(divs, ".4g") if not divs.empty
              else "No speculative output differed from plain greedy.\n", ""]
    s += [f"## Sampling correctness: distribution tests (campaign {campaign})\n"]
    if not rates.empty:
        s += ["Contexts where the draft nearly equals the target give the test no power; they are counted "
              "apart and never as passes. `mean_power` is the simulated chance, at the same number of draws, "
              "of rejecting the two wrong rules (for a wrong rule: that rule).\n",
              _fig(figs, report, "distribution_rejections.png", "rejection rates per rule"),
              markdown_table(rates, ".3g"), "",
              f"Every test ({len(tests)} rows): [{APPENDIX}]({APPENDIX}#every-distribution-test).\n"]
    s += batch_section(t["batch_costs"], t["batch_speedups"], t["batch_model_error"], figs, report, campaign)
    s += pair_campaign_section(params)
    s += spec_bench_section(params)
    s += trees_section(params)
    s += candidates_section(ans)
    s += jobs_section(jobs, campaign)
    return "\n".join(s)


def pair_campaign_section(params: dict) -> list[str]:
    """The second campaign's section (issue 21), as analysis.pair_section wrote it; none without pair_campaign."""
    campaign = params.get("pair_campaign")
    if not campaign:
        return []
    campaign_dir(params["outputs_dir"], campaign)  # a name, never a path
    return section_file(Path(params["analysis_dir"]) / campaign / "section.md", f"Pair campaign {campaign}",
                        "analysis.pair_section")


def trees_section(params: dict) -> list[str]:
    """The tree-vs-chain section, as analysis.trees wrote it; none without trees_campaign."""
    if not params.get("trees_campaign"):
        return []
    return section_file(Path(params["analysis_dir"]) / "trees" / "section.md", "Tree-shaped drafts vs chains",
                        "analysis.trees")


def spec_bench_section(params: dict) -> list[str]:
    """The Spec-Bench table's section, as analysis.spec_bench wrote it; none without spec_bench_campaign."""
    if not params.get("spec_bench_campaign"):
        return []
    return section_file(Path(params["analysis_dir"]) / "spec_bench" / "section.md", "Spec-Bench workloads",
                        "analysis.spec_bench")


def section_file(path: Path, title: str, module: str) -> list[str]:
    """A section another script wrote, or its title and how to write it."""
    if not path.is_file():
        return [f"## {title}\n", f"_no section yet: run `python -m {module}` (or `dvc repro`)_\n"]
    return [path.read_text().rstrip("\n") + "\n"]


def time_model_section(t: dict[str, pd.DataFrame], figs: Path, report: Path) -> list[str]:
    """Issue 10: the time model against the i.i.d. formula on held-out prompts, and exercise 4."""
    points, errors, cal, ex4 = (t[n] for n in ("time_model_points", "time_model_errors", "time_model_calibration",
                                                "time_model_exercise4"))
    if points.empty or cal.empty:
        return ["## Predicting the speed-up: the time model\n", "_no time-model results yet (analysis.time_model)_\n"]
    c = cal.iloc[0]
    s = [f"## Predicting the speed-up: the time model (campaign {c.campaign})\n",
         f"Campaign **{c.campaign}** (`params.yaml: time_model.campaign`), one session on one machine. "
         f"**Calibration** (timing stage and the acceptance stage's own loop times): prompts {c.calibration_prompts}. "
         f"**Validation** (speed stage, adjacent rotated runs; nothing fitted on it): the held-out prompts "
         f"{c.held_out_prompts}. The model prices each recorded iteration: the draft's catch-up pass (1 or 2 "
         "tokens, more after lookup), its single-token steps, the target's pass over k + 1 tokens at the "
         "iteration's context, both prefills, and the loop's own costs; tokens per iteration are the recorded ones, "
         "so bursts, EOS and the budget's short last iteration are included. Two variants: *own acceptance* replays "
         "each held-out prompt's own acceptance run (the cheap stage run on the user's prompts), *kind sample* "
         "replays the calibration prompts of the same kind (what the planner does for unseen prompts). The i.i.d. "
         "formula uses the same acceptance, with c_draft and c_verify(k) from the same timing rows. *At each "
         "block's step times*: the same model and own acceptance, with each model's pass times scaled by the ratio "
         "of its one-token step timed just before that block (`stage.block_timing_repeats`) to the calibrated "
         "step, one prediction per run; it separates the model's error from the machine's drift between the "
         "calibration and the runs (only those step timings are read from the speed job, never its run times or "
         "ratios).\n",
         f"Calibrated constants: target step {c.target_step_ms:.1f} ms, draft step {c.draft_step_ms:.1f} ms at "
         f"{c.context_ref:.0f} tokens of context (+{1e3 * c.target_ms_per_context_token:.1f} / "
         f"+{1e3 * c.draft_ms_per_context_token:.1f} us per further token); in-loop / isolated pass time: "
         f"target passes x{c.target_scale:.3f}, draft x{c.draft_scale:.3f}; per iteration: rollback "
         f"{c.rollback_ms:.2f} ms, bookkeeping {c.bookkeeping_ms:.2f} ms, lookup {c.lookup_ms:.2f} ms.\n",
         _fig(figs, report, "time_model_speedup.png", "time model vs i.i.d. formula"),
         "Per kind and k: measured, the time model at each block's step times (`tm_block`) and replaying each "
         "prompt's own acceptance (`tm_own`), and the i.i.d. formula (`iid_own`); every predictor with its interval "
         f"and run counts: [{FULL_TABLES}/time_model_points.csv](analysis/{FULL_TABLES}/time_model_points.csv).\n",
         markdown_table(points[[c for c in ["kind", "k", "runs", "measured", "measured_lo", "measured_hi", "tm_block",
                                            "tm_own", "tm_kind", "iid_own"] if c in points]]), "",
         "Error of each predictor against the measured median (absolute; signed mean > 0 = over-prediction):\n",
         markdown_table(errors), "",
         "Against the goal (absolute error <= 0.05 at every kind and k, mean absolute error under half "
         "the i.i.d. formula's with the same acceptance and the same step times):\n",
         markdown_table(time_model_goals(errors)), "",
         _fig(figs, report, "time_model_decomposition.png", "where the time goes")]
    if not ex4.empty:
        s += exercise4_text(ex4, t["time_model_decomposition"])
    return s


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


def exercise4_text(ex4: pd.DataFrame, dec: pd.DataFrame) -> list[str]:
    """The chapter's exercise 4 answered with this campaign's numbers."""
    show = ex4[ex4.kind != "all"]
    s = ["### Exercise 4: why the formula over-predicts on code\n",
         "Per kind and k, over every speed run of the draft model at a fixed k: alpha-hat and the share of "
         "all-accepted iterations from the acceptance stage, tokens per pass counted vs the formula's "
         "(1 - a^(k+1))/(1 - a), and the time of an iteration (wall minus prefill, per iteration) vs the "
         "formula's k draft steps + one check. `tokens_factor` x `iteration_factor` is how much the formula "
         "over-states tokens per second of the speculative run (before prefills).\n",
         markdown_table(show[["kind", "k", "alpha", "bonus_share", "tokens_per_pass", "tokens_per_pass_formula",
                              "draft_ms_per_iter", "draft_ms_formula", "iteration_ms", "iteration_ms_formula",
                              "prefill_share", "tokens_factor", "iteration_factor"]]), ""]
    at = show[show.k == (6 if (show.k == 6).any() else show.k.max())].set_index("kind")
    if {"code", "prose"} <= set(at.index):
        code, prose = at.loc["code"], at.loc["prose"]
        over = {kd: r.tokens_factor * r.iteration_factor for kd, r in at.iterrows()}
        d = dec[(dec.source == "predicted") & (dec.kind == "code") & (dec.k == code.k)] if not dec.empty else dec
        catch_up = (f"{100 * (d.catch_up_ms / (d.catch_up_ms + d.draft_steps_ms)).iloc[0]:.1f}%" if len(d)
                    else "a share")
        main = "tokens per pass" if abs(np.log(code.tokens_factor)) >= abs(np.log(code.iteration_factor)) \
            else "the time of an iteration"
        s.append(
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
            f"them into one alpha and one step time; its errors are in the table above, next to the formula's.\n")
    return s


def best_fixed_verdict(check: pd.DataFrame) -> list[str]:
    """In words, per check design: recommended vs the best fixed configuration, pooled and where the plan
    chose something else."""
    rows = check[check.comparison == "recommended vs best fixed"]
    out = []
    for design, g in rows.groupby("check", sort=False):
        pooled = g[g.kind == "all"].iloc[0]
        stale = int(pooled.get("other_plan_blocks", 0) or 0)
        left_out = (f" ({stale} blocks that ran an earlier plan's choice are left out)" if stale else "")
        if not pooled.blocks:
            out.append(f"- **{design.capitalize()}**: no runs of the latest plan's recommendation{left_out}.")
            continue
        tie = pooled.ratio_lo <= pooled.goal <= pooled.ratio_hi
        verdict = "a tie at this number of blocks" if tie else ("above" if pooled.median_ratio > pooled.goal else "below")
        diff = g[(g.kind != "all") & (g.config != g.baseline)]
        own = "; ".join(f"{r.kind} ran {r.config.replace('speculative ', '')}: {r.median_ratio:.3f} "
                        f"({r.ratio_lo:.3f}-{r.ratio_hi:.3f})" for r in diff.itertuples())
        out.append(f"- **{design.capitalize()}**: recommended vs {pooled.baseline.replace('speculative ', '')} "
                   f"(chosen {pooled.baseline_chosen}), {int(pooled.blocks)} blocks{left_out}, "
                   f"{pooled.runs_apart:.0f} run{'' if pooled.runs_apart == 1 else 's'} apart: "
                   f"median ratio {pooled.median_ratio:.3f} ({pooled.ratio_lo:.3f}-{pooled.ratio_hi:.3f}), {verdict}. "
                   + (f"Where the plan chose another configuration: {own}. " if own else
                      "The plan chose the baseline's configuration for every kind. ")
                   + (f"Where it chose the same one ({int(pooled.same_config_blocks)} blocks), the ratio of two runs "
                      f"of one configuration has IQR {pooled.same_config_q25:.3f}-{pooled.same_config_q75:.3f}: "
                      f"this design's noise floor." if pooled.same_config_blocks else ""))
    return out + ([""] if out else [])


# The planner's check as the report shows it (the full table: outputs/analysis/report_tables/planner_check.csv).
CHECK_COLUMNS = ["check", "comparison", "kind", "config", "baseline", "blocks", "runs_apart", "median_ratio", "ratio_lo",
                 "ratio_hi", "goal", "met"]


def shown_check(check: pd.DataFrame) -> pd.DataFrame:
    """The check's rows that hold a comparison (a design without runs of the latest plan's recommendation has
    none: the verdict line says so), in the columns a reader needs."""
    return check[check.blocks > 0][[c for c in CHECK_COLUMNS if c in check]]


def planner_section(t: dict[str, pd.DataFrame], campaign: str | None = None) -> list[str]:
    plan, check, ranking = t["recommendation"], t["recommendation_check"], t["recommendation_ranking"]
    if plan.empty:
        return []
    rec = plan[plan.recommended]
    s = ["## The planner's recommendation, checked" + (f" (campaign {campaign})" if campaign else "") + "\n",
         "`python -m pipeline.run +sweep=plan` ran the timing and acceptance stages on the calibration prompts "
         "(every drafter at k = 1..8 and with the cost-model policy) and predicted each configuration with the time "
         "model; `python -m analysis.recommend` prints it. Recommended per kind (interval: bootstrap over the "
         "sample prompts; the robust configuration, best worst case over all sample prompts, unless a kind's "
         "own best passes a sign test on that kind's prompts, `chosen_by`):\n",
         markdown_table(rec[[c for c in ["pair", "kind", "drafter", "k_policy", "k", "prompts", "predicted",
                                         "predicted_lo", "predicted_hi", "predicted_iid", "worst_ratio", "chosen_by"]
                             if c in rec]]), ""]
    if not check.empty:
        s += ["The speed stage ran the recommendation as an arm in the same rotated blocks as plain. Two designs "
              "(`check`): the *exploratory* check (`+sweep=check_plan`) runs it beside every fixed configuration, "
              "the cost-model policy and transformers' assisted generation with default settings, on all prompts, "
              "and picks the best fixed configuration after the runs (the winner of many noisy arms, so favoured, "
              "and `runs_apart` from the recommendation in a block of `arms_per_block` runs, with the machine's "
              "drift in between); the *confirmatory* check (`+sweep=confirm_plan`) names that configuration "
              "before its runs and runs only plain, it, the recommendation and transformers' default, so the two "
              "compared are at most three runs apart; recommended runs of an earlier plan's choice are left out "
              "(counted in the verdict lines). Ratios are medians of within-block tokens/s ratios (95% bootstrap interval; `met` compares "
              "the median with the goal, and where the interval straddles the goal the comparison is a tie at "
              "this number of blocks). The full table, with each arm's pooled speed-up over its block's plain run and "
              "the noise floor of each design (two runs of one configuration in one block), is "
              f"[{FULL_TABLES}/planner_check.csv](analysis/{FULL_TABLES}/planner_check.csv).\n",
              markdown_table(shown_check(check)), "", *best_fixed_verdict(check),
              "Every arm's pooled speed-up over its block's plain run in the exploratory check:\n",
              markdown_table(ranking), ""]
    return s


def batch_section(costs: pd.DataFrame, speed: pd.DataFrame, errors: pd.DataFrame, figs: Path, report: Path,
                  campaign: str | None = None) -> list[str]:
    """Exercise 7 of the chapter, answered from the batch stage's numbers."""
    if speed.empty:
        return []
    s = ["## Batches: where the check stops being free, where speculation stops paying"
         + (f" (campaign {campaign}, batch stage)" if campaign else "") + "\n",
         _fig(figs, report, "batch_pass_time.png", "target pass time over batch size x pass length"),
         "*Left: the target's pass over B rows x n new tokens. Right: the same over the one-token step at that B, "
         "i.e. c_verify(B, k = n - 1); a flat line at 1 means checking k proposals costs no more than one step.*\n",
         _fig(figs, report, "batch_speedup.png", "speed-up vs batch size"),
         "*Measured speed-up of batched speculative over batched plain decoding (tokens/s summed over rows, "
         "median of adjacent-run ratios with 95% bootstrap intervals) against the chapter's formula at that B "
         "(dashed) and the time model at that B (dotted).*\n"]
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
    s += ["**Exercise 7 on this machine.** Where the pass stops being flat (within 1.25 one-token steps at the "
          "same B): " + "; ".join(flat) + ". Best measured speed-up per B: "
          + ", ".join(f"B = {r.batch_size}: x{r.measured:.2f} at k = {r.k}" for r in best.itertuples())
          + f"; {verdict}" + (f"; it clearly pays (interval above 1) at B = {', '.join(str(b) for b in paying.batch_size)}"
                             if len(paying) else "")
          + f". The lowest break-even alpha over k {trend} from {be.iloc[0]:.2f} at B = {be.index[0]} to "
          f"{be.iloc[-1]:.2f} at B = {be.index[-1]} (table).\n",
          markdown_table(speed[["pair", "batch_size", "k", "runs", "measured", "measured_lo", "measured_hi", "predicted",
                                "alpha", "break_even_alpha", "identical_share"]]), "",
          "`identical_share`: rows equal to the batched plain run's rows. The full table (costs c_draft, c_verify, "
          "tokens/s of both arms, the layout work's and masked slots' shares) is "
          f"[{FULL_TABLES}/batch_speedups.csv](analysis/{FULL_TABLES}/batch_speedups.csv).\n"]
    return s + batch_model_section(speed, errors)


def batch_model_section(speed: pd.DataFrame, errors: pd.DataFrame) -> list[str]:
    """The time model at B against the chapter's formula at B: error per B."""
    s = ["### Predicting the batched speed-up: the time model at B against the formula at B\n",
         "`predicted` (the formula at B) prices an iteration at k batched draft steps plus one batched check "
         "from the pass rows, with i.i.d. tokens per row. `predicted_time_model` is the batch-1 planner's time "
         "model (`speclab.batch_time_model`) run in lockstep: each row replays its greedy acceptance run at "
         "that k (acceptance stage), rows leave the batch as they finish, every pass is priced from the job's "
         "own pass rows over rows x new tokens, with the draft's catch-up and both prefills. What the batch "
         "stage does not time (the prefills' cost per padded token; the loop's in-loop over isolated pass "
         "time, rollback and bookkeeping at that B) is calibrated on the other blocks of the same job, never on "
         "the run predicted; `predicted_no_loop` leaves the loop's costs out.\n"]
    if errors.empty or errors.time_model_mae.isna().all():
        return s + ["_No time-model prediction: the campaign needs greedy acceptance runs of the batch's prompts "
                    "at its k, and at least two blocks per job and batch size._\n"]
    half, missing = errors.time_model_mae < errors.formula_mae / 2, errors.time_model_mae.isna()
    verdict = ("below half the formula's at every B" if half.all() else
               "NOT below half the formula's at B = " + ", ".join(str(b) for b in errors.batch_size[~half & ~missing])
               if (~half & ~missing).any() else "below half the formula's at every B it predicts")
    if missing.any():
        verdict += " (no prediction at B = " + ", ".join(str(b) for b in errors.batch_size[missing]) + ")"
    s += [f"Mean absolute error of the predicted speed-up over k, per B: the time model's is {verdict} "
          "(`error_ratio`: time model's over formula's; `no_loop`: the time model without the loop's own costs; "
          "`bookkeeping_ms`: per iteration, as calibrated at that B).\n",
          markdown_table(errors[["pair", "batch_size", "points", "formula_mae", "time_model_mae", "no_loop_mae",
                                 "error_ratio", "bookkeeping_ms"]]), "",
          f"(Maxima, signed errors and the calibrated scales: [{FULL_TABLES}/batch_model_error.csv]"
          f"(analysis/{FULL_TABLES}/batch_model_error.csv).)\n",
          markdown_table(speed[["pair", "batch_size", "k", "measured", "predicted", "predicted_time_model",
                                "predicted_no_loop", "iterations", "predicted_iterations"]]), ""]
    return s


def answer_section(ans: Answer | None) -> list[str]:
    """The first screen (analysis.answer), or how to make it."""
    if ans is None:
        return ["## The answer\n", "_not computed yet: run `python -m analysis.answer` (or `dvc repro`)_\n"]
    return render(ans)


def _measure(v: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    return f"x{v:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if lo == lo and hi == hi else "")


def why_numbers_differ(ans: Answer | None, t: dict[str, pd.DataFrame], tree_arms: pd.DataFrame,
                       params: dict) -> list[str]:
    """One paragraph: the sections measure in different campaigns (jobs, days, commits, designs), shown on the
    draft model at k = 4 of the published pair wherever a section measured it."""
    if ans is None or ans.provenance.empty:
        return []
    prov = ans.provenance.set_index(["campaign", "stage"])

    def when(campaign: str, stage: str) -> str:
        if (campaign, stage) not in prov.index:
            return f"campaign {campaign}"
        p = prov.loc[(campaign, stage)]
        day = p.first_day if p.first_day == p.last_day else f"{p.first_day} to {p.last_day}"
        return f"campaign {campaign}, {stage} stage, {day}, commit {p.commits.split(',')[-1]}"

    campaign, k = published_campaign(params), 4
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
        r, trees = tr.iloc[0], params.get("trees_campaign")
        seen.append(f"{_measure(r.speedup, r.speedup_lo, r.speedup_hi)} in *Tree-shaped drafts* "
                    f"({when(trees, 'speed')}: chains and trees rotated in one block)")
    if not seen:
        return []
    return ["## Why numbers differ between sections\n",
            "Each section reads its own campaign: other jobs, days, commits and designs, on a CPU whose speed "
            "changes with its load, so one configuration has several measured speed-ups. The draft model at "
            f"k = {k} on {pair}: " + "; ".join(seen) + ". Differences of this size come from the day, the machine's "
            "state and the design, not from the configuration: compare configurations within one section (the "
            "answer above does, within each campaign), and read a number together with the campaign its heading "
            "names.\n"]


def candidates_section(ans: Answer | None, top: int = 3) -> list[str]:
    """The configurations the answer chose between: the best ``top`` per campaign, pair and kind (greedy)."""
    if ans is None or ans.candidates.empty:
        return []
    c = ans.candidates[ans.candidates.sampling == "greedy"]
    c = c.groupby(["campaign", "pair", "kind"], sort=False).head(top)
    return ["## Behind the answer: the best configurations per campaign, pair and kind\n",
            f"The {top} fastest greedy configurations of each campaign, pair and prompt kind (median speed-up over "
            "the adjacent plain run, 95% bootstrap interval); every configuration, sampled ones too: "
            "[answer/candidates.csv](analysis/answer/candidates.csv).\n",
            markdown_table(c[["campaign", "pair", "kind", "config", "runs", "speedup", "speedup_lo", "speedup_hi"]]),
            ""]


def full_tables(params: dict) -> dict[str, pd.DataFrame]:
    """The report's cut tables in full, for CSV (outputs/analysis/report_tables/)."""
    out = Path(params["analysis_dir"])
    return {"time_model_points": read_table(out, "time_model_points"),
            "planner_check": read_table(out, "recommendation_check"), "batch_speedups": read_table(out, "batch_speedups"),
            "batch_model_error": read_table(out, "batch_model_error")}


def appendix(params: dict) -> str:
    """outputs/report_appendix.md: the long tables a reader of the report skips (every distribution test)."""
    tests = read_table(params["analysis_dir"], "distribution_tests")
    return "\n".join(["# speclab report: appendix\n",
                      f"Campaign **{published_campaign(params)}**; back to the [report](report.md).\n",
                      "## Every distribution test\n",
                      markdown_table(tests, ".3g") if not tests.empty else "_no distribution tests_\n"])


def main() -> None:
    params = load_params()
    path = Path(params["outputs_dir"]) / "report.md"
    text = build_report(params)
    tables = full_tables(params)
    extra = appendix(params)
    for name, df in tables.items():
        if not df.empty:
            save_csv(df, Path(params["analysis_dir"]) / FULL_TABLES / f"{name}.csv")
    atomic_write_text(Path(params["outputs_dir"]) / APPENDIX, extra)
    atomic_write_text(path, text)
    print(f"analysis.report: wrote {path}")


if __name__ == "__main__":
    run_script("analysis.report", main)
