"""Print the planner's recommendation per prompt kind, and how it fared in adjacent runs.

    python -m analysis.recommend                       (the answer on one screen, then the most recent plan)
    python -m analysis.recommend --campaign timemodel2  (that campaign's plan, and its check)

The plan comes from `python -m pipeline.run +sweep=plan` (stage plan). When the same campaign holds
speed runs with the `recommended` arm (`+sweep=check_plan`), the check compares it, block by block,
with the best fixed configuration, transformers' assisted generation with default settings, and the
cost-model policy with fixed k = 4; a confirmatory check (`+sweep=confirm_plan`) names the best
fixed configuration before its runs and is reported beside the exploratory one. ``--write`` also stores both tables (the DVC stage does).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.answer import read_answer, render_text
from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, markdown_table, run_script, save_json,
                             save_table, with_defaults)
from analysis.inputs import AnalysisError, read_stage_files, store_errors
from speclab.specs.arms import Arm
from store.best_fixed import BLOCK, BestFixed, best_fixed, exploratory_blocks, fixed_rows
from store.plan_check import COLUMNS as PLAN_CHECK_COLUMNS, SHORTFALL, block_ratios, kind_checks, track_record, retime_command, untrusted_text
from store.plans import latest_plan, latest_plan_campaign

GOALS = {"recommended vs best fixed": 1.0, "recommended vs transformers default": 1.3,
         "cost-model policy vs fixed k=4": 1.0}


def latest_campaign(outputs_dir: str) -> str:
    """The campaign whose plan finished last."""
    # The provenance record is enough to pick one; read_stage then checks the chosen campaign's files.
    with store_errors():
        campaign = latest_plan_campaign(outputs_dir)
    if campaign is None:
        raise AnalysisError("no plan found under outputs/campaigns/*/plan: run `python -m pipeline.run +sweep=plan` first")
    return campaign


def read_plans(outputs_dir: str, campaign: str) -> pd.DataFrame:
    """Every plan job of the campaign, each row with its job's ``finished_at`` (provenance record)."""
    files = read_stage_files(outputs_dir, campaign, "plan")
    if not files:
        return pd.DataFrame()
    return with_defaults(pd.concat([f.data.assign(finished_at=str(f.meta.get("finished_at", ""))) for f in files],
                                   ignore_index=True))


def config_label(df: pd.DataFrame) -> pd.Series:
    """Each row's configuration as a compact label (``speclab.specs.arms.Arm.key``)."""
    return pd.Series([Arm.from_row(r).key for r in df.itertuples()], index=df.index, dtype=object)


def checked_blocks(speed: pd.DataFrame) -> pd.DataFrame:
    """Every arm's rows in the blocks that ran the recommended arm."""
    return speed.merge(speed[speed.arm == "recommended"][BLOCK].drop_duplicates(), on=BLOCK)


def _distance(speed: pd.DataFrame, a: pd.Series, b: pd.Series) -> float:
    """Median number of runs between arm rows ``a`` and ``b`` in a block (1: back to back)."""
    pa, pb = speed[a].groupby(BLOCK).position.median(), speed[b].groupby(BLOCK).position.median()
    both = pa.index.intersection(pb.index)
    return float((pa[both] - pb[both]).abs().median()) if len(both) else float("nan")


def _comparisons(speed: pd.DataFrame, design: str, explo_best: BestFixed | None) -> list[tuple]:
    """(name, rows a, rows b, baseline label, how the baseline was chosen) for one check design."""
    rec = speed.arm == "recommended"
    out = []
    if design == "exploratory":  # explo_best was picked from these very blocks
        label = f"speculative {explo_best.drafter} k={explo_best.k}"
        out.append(("recommended vs best fixed", rec, speed.config == label, label,
                    f"after the runs: the best of {explo_best.configs} fixed configurations in these blocks"))
    else:
        for (drafter, k), _ in speed[fixed_rows(speed)].groupby(["drafter", "k"]):
            label = f"speculative {drafter} k={k}"
            named = (explo_best is not None and (drafter, int(k)) == (explo_best.drafter, explo_best.k))
            out.append(("recommended vs best fixed", rec, speed.config == label, label,
                        "before the runs: the exploratory check's best" if named else "before the runs"))
    hf = speed.arm == "hf_default"
    if hf.any():
        out.append(("recommended vs transformers default", rec, hf, "hf_default", "before the runs"))
    cm = (speed.arm == "speculative") & (speed.k_policy == "cost_model") & (speed.drafter == "model")
    k4 = (speed.arm == "speculative") & (speed.k_policy == "fixed") & (speed.drafter == "model") & (speed.k == 4)
    if cm.any() and k4.any():
        out.append(("cost-model policy vs fixed k=4", cm, k4, "speculative model k=4", "before the runs"))
    return out


def _config_of(rows: pd.DataFrame) -> str:
    """What the compared arm ran: one configuration, or "per kind" (the plan's choice differs by kind)."""
    labels = sorted(set(rows.config))
    if not labels:
        return "none of the latest plan's"
    return labels[0].replace("recommended", "speculative", 1) if len(labels) == 1 else "per kind"


def _ratios(speed: pd.DataFrame, a: pd.Series, b: pd.Series, same_as: str | None, boot: dict) -> dict:
    """Median of within-block ratios of rows ``a`` over rows ``b``, its interval, how far apart the two
    ran, and (``same_as``: the baseline's label) the noise floor from blocks where ``a`` ran that config."""
    r = block_ratios(speed, a, b)
    lo, hi = bootstrap_ci(r, np.median, **boot)
    med = float(np.median(r)) if len(r) else float("nan")
    # Blocks where the recommendation *is* the baseline's configuration: two runs of one
    # configuration, so their ratios are the check's noise floor on this machine.
    same = block_ratios(speed, a & speed.config.str.replace("recommended", "speculative", n=1).eq(same_as), b) \
        if same_as else np.array([])
    q = np.quantile(same, [0.25, 0.75]) if len(same) else (np.nan, np.nan)
    return {"runs_apart": _distance(speed, a, b), "blocks": len(r), "median_ratio": med, "ratio_lo": lo,
            "ratio_hi": hi, "same_config_blocks": len(same),
            "same_config_median": float(np.median(same)) if len(same) else np.nan,
            "same_config_q25": float(q[0]), "same_config_q75": float(q[1]),
            "speedup_a": float(speed[a].ratio_to_adjacent_plain.median()),
            "speedup_b": float(speed[b].ratio_to_adjacent_plain.median())}


def read_speed(outputs_dir: str, campaign: str) -> pd.DataFrame:
    """The campaign's speed rows, each with its job's start (``job_started_at``) and the plan file its
    recommended arm followed (``job_plan``, from the provenance record; None where a job predates it)."""
    files = read_stage_files(outputs_dir, campaign, "speed")
    if not files:
        return pd.DataFrame()
    return with_defaults(pd.concat([f.data.assign(job_started_at=str(f.meta.get("started_at", "")),
                                                  job_plan=(f.meta.get("inputs") or {}).get("plan"))
                                    for f in files], ignore_index=True)).assign(campaign=campaign)


def other_plans(speed: pd.DataFrame, plan: pd.DataFrame | None) -> pd.Series:
    """Recommended-arm rows not run under ``plan`` (the latest plan): their job names another plan
    (``job_plan``), or started before that plan finished, or (a job that records neither) ran another
    configuration than the plan recommends for their pair and kind. None: no row is flagged."""
    flagged = pd.Series(False, index=speed.index)
    if plan is None or plan.empty:
        return flagged
    chosen = {(r.pair, r.kind): (r.drafter, r.k_policy, int(r.k)) for r in plan[plan.recommended].itertuples()}
    made = {r.pair: (f"{r.pair}-{r.config_hash}", str(r.finished_at)) for r in plan.itertuples()}
    for i, r in speed[speed.arm == "recommended"].iterrows():
        stem, finished = made.get(r.pair, (None, ""))
        followed, started = r.get("job_plan"), r.get("job_started_at")
        if isinstance(followed, str):
            flagged[i] = followed != stem
        elif isinstance(started, str) and started and finished and started < finished:
            flagged[i] = True
        else:
            want = chosen.get((r.pair, r.kind)) or chosen.get((r.pair, "all"))
            flagged[i] = want is not None and want != (r.drafter, r.k_policy, int(r.k))
    return flagged


def check(speed: pd.DataFrame, boot: dict, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    """The three comparisons of the plan's check, as medians of within-block ratios, per check design.

    Only blocks that ran the recommended arm count, so every arm is pooled over the same prompts
    and rounds (other speed jobs of the campaign may cover other prompts, other arms). The
    *exploratory* check (``+sweep=check_plan``) picks the best fixed configuration after the runs
    from many arms; the *confirmatory* one (``+sweep=confirm_plan``) names it before the runs and
    runs it next to the recommendation. With ``plan`` (the latest plan's rows), recommended runs made
    under another plan (``other_plans``) are left out of the comparisons with the recommendation (counted
    in ``other_plan_blocks``); the best fixed configuration and the policy's comparison keep every block.
    """
    speed = checked_blocks(speed)
    if speed.empty:
        return pd.DataFrame()
    speed = speed.assign(config=config_label(speed), other_plan=other_plans(speed, plan))
    explo = exploratory_blocks(speed)
    explo_best = best_fixed(explo)
    rows = []
    for design, part in (("exploratory", explo), ("confirmatory", speed[~speed.config_hash.isin(explo.config_hash)])):
        if part.empty:
            continue
        stale = part[part.other_plan][BLOCK].drop_duplicates()
        part = part[~part.other_plan]
        # Block size where the latest plan's recommendation ran (an earlier check's blocks may differ).
        current = part[part.arm == "recommended"][BLOCK].drop_duplicates()
        arms_per_block = float((part.merge(current, on=BLOCK) if len(current) else part).groupby(BLOCK).size().median())
        for name, a, b, b_label, chosen in _comparisons(part, design, explo_best):
            # The best-fixed comparison also per kind: where the plan chose something else, and how that fared.
            kinds = ["all"] + (sorted(part.kind.unique()) if name == "recommended vs best fixed" else [])
            for kind in kinds:
                sub = part.kind.eq(kind) | (kind == "all")
                rows.append({"check": design, "comparison": name, "kind": kind,
                             "config": _config_of(part[a & sub]), "baseline": b_label,
                             "baseline_chosen": chosen, "arms_per_block": arms_per_block,
                             **_ratios(part, a & sub, b & sub, b_label if name == "recommended vs best fixed" else None,
                                       boot),
                             "other_plan_blocks": len(stale) if "recommended" in name else 0,
                             "goal": GOALS[name]})
                rows[-1]["met"] = bool(rows[-1]["median_ratio"] >= GOALS[name])
    return pd.DataFrame(rows)


def unseen_check(speed: pd.DataFrame, plan: pd.DataFrame) -> pd.DataFrame:
    """The loop closed, per pair and kind, for the latest plan: its choice, its predicted speed-up and where it said
    an unseen prompt of the kind would fall (and how often), the speed-up measured on the checked prompts it did not
    see (inside or not), and the recommendation against the best arm measured beside it (``store.plan_check``)."""
    runs = speed[~other_plans(speed, plan)] if not speed.empty else speed
    return kind_checks(runs, plan)


def check_history(speed: pd.DataFrame, plans: pd.DataFrame, latest: pd.DataFrame) -> pd.DataFrame:
    """``unseen_check`` for every plan of the campaign that a check followed: the latest plan's as above, an earlier
    plan's on the runs of the jobs that recorded following it (``job_plan``). Its rows are the planner's track record."""
    out = []
    if speed.empty or plans.empty:
        return pd.DataFrame(columns=["plan", *PLAN_CHECK_COLUMNS])
    latest_stem = {f"{r.pair}-{r.config_hash}" for r in latest.itertuples()}
    for (pair, job), p in plans.groupby(["pair", "config_hash"], sort=True):
        stem = f"{pair}-{job}"
        runs = speed[~other_plans(speed, p)] if stem in latest_stem else speed[speed.job_plan.eq(stem)]
        if (runs.arm == "recommended").any():
            out.append(kind_checks(runs, p).assign(plan=stem, finished_at=str(p.finished_at.iloc[0])))
    if not out:
        return pd.DataFrame(columns=["plan", *PLAN_CHECK_COLUMNS])
    return pd.concat(out, ignore_index=True).sort_values(["finished_at", "pair", "kind"]).drop(columns="finished_at")


def plan_summary(plan: pd.DataFrame) -> pd.DataFrame:
    """Per pair and kind, what the plan says and on what: its choice, per kind or pooled (and why), the sample's size
    and why it stopped there, the predicted speed-up, the interval for an unseen prompt with how often it holds, and
    the kind's own choice's held-out gain over the pooled one with its error (cross-validated: leave one prompt out)."""
    rows = []
    for r in plan[plan.recommended & (plan.kind != "all")].sort_values(["pair", "kind"]).itertuples():
        why = str(getattr(r, "chosen_by", "") or "")
        cover = getattr(r, "unseen_coverage", np.nan)
        rows.append({"pair": r.pair, "kind": r.kind,
                     "choice": Arm("speculative", int(r.k) or None, str(r.k_policy), str(r.drafter)).label,
                     "trust": "UNTRUSTED" if untrusted_text(r) else "ok",
                     "chosen": "per kind" if why.startswith("kind's best") else "pooled" if why else "not recorded",
                     "sample": int(r.prompts), "predicted": float(r.predicted),
                     "unseen": f"{r.unseen_lo:.2f}-{r.unseen_hi:.2f} ({100 * cover:.0f}%)" if cover == cover
                     else "not stated",
                     "cv_gain": getattr(r, "cv_gain", np.nan), "cv_error": getattr(r, "cv_error", np.nan),
                     "sample_stop": str(getattr(r, "sample_stop", "") or ""), "why": why})
    return pd.DataFrame(rows, columns=["pair", "kind", "choice", "trust", "chosen", "sample", "predicted", "unseen",
                                       "cv_gain", "cv_error", "sample_stop", "why"])


def fixed_ranking(speed: pd.DataFrame, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every arm's pooled median speed-up over adjacent plain runs, best first (the recommended arm's
    runs of the latest plan only, with ``plan``)."""
    s = speed[(speed.arm != "plain") & ~other_plans(speed, plan)]
    s = s.assign(config=config_label(s))
    s.loc[s.arm == "recommended", "config"] = "recommended (per kind)"
    return (s.groupby("config").ratio_to_adjacent_plain.agg(["median", "count"]).reset_index()
            .rename(columns={"median": "speedup", "count": "runs"}).sort_values("speedup", ascending=False))


@dataclass(frozen=True)
class Recommendation:
    """A campaign's latest plan per pair, its check in adjacent runs and the exploratory ranking (both
    empty without check runs)."""

    plan: pd.DataFrame
    check: pd.DataFrame
    ranking: pd.DataFrame
    unseen: pd.DataFrame  # the plan's statement for an unseen prompt against the prompts its check ran
    history: pd.DataFrame  # the same for every plan of the campaign a check followed (the track record's rows)

    @property
    def record(self) -> dict[str, float]:
        """The planner's track record in this campaign (``store.plan_check.track_record``)."""
        return track_record(self.history)


def recommendation(outputs_dir: str, campaign: str, boot: dict) -> Recommendation | None:
    """The latest plan of ``campaign`` and how it fared (None: the campaign holds no plan)."""
    plans = read_plans(outputs_dir, campaign)
    if plans.empty:
        return None
    plan = latest_plan(plans)
    speed = read_speed(outputs_dir, campaign)
    checked = check(speed, boot, plan) if not speed.empty else pd.DataFrame()
    ranking = fixed_ranking(exploratory_blocks(checked_blocks(speed)), plan) if not checked.empty else pd.DataFrame()
    return Recommendation(plan, checked, ranking, unseen_check(speed, plan), check_history(speed, plans, plan))


def record_text(record: dict[str, float]) -> str:
    """The track record in one sentence."""
    if not record["checks"]:
        return "track record: no check of a plan yet (`python -m pipeline.run +sweep=check_plan` in its campaign)"

    def pct(v: float) -> str:
        return f"{100 * v:.0f}%" if v == v else "not stated"

    return (f"track record: {record['checks']:.0f} kind(s) checked, the measured speed-up inside the stated interval "
            f"in {pct(record['inside_share'])}; {record['prompts_checked']:.0f} checked prompts with a stated interval, "
            f"{pct(record['prompts_inside_share'])} inside (stated {pct(record['stated_coverage'])}); the "
            f"recommendation held against the best measured arm in {pct(record['holds_share'])}")


def retime_lines(outputs_dir: str, campaign: str, plan: pd.DataFrame) -> list[str]:
    """Per pair whose plan priced an untrusted timing or acceptance part: the command that measures it again."""
    from store.layout import stage_dir
    from store.records import read_meta

    out = []
    for r in plan.drop_duplicates("pair").itertuples():
        if untrusted_text(r):
            meta = read_meta(stage_dir(outputs_dir, campaign, "plan") / f"{r.pair}-{r.config_hash}.parquet")
            out.append(f"{r.pair}: the plan is {untrusted_text(r)}; {retime_command(meta.get('overrides') or [])}")
    return out


def show_plan(plan: pd.DataFrame, top: int) -> str:
    lines = []
    for pair, p in plan.groupby("pair"):
        lines.append(f"pair {pair}: plan on prompts {p.prompt_ids.iloc[0]} "
                     f"({100 * p.level.iloc[0]:.0f}% distribution-free intervals of the median over prompts; "
                     "an unseen prompt: where one more prompt of the kind falls, and how often)")
        for kind, g in p.groupby("kind", sort=True):
            g = g.sort_values("rank")
            g = g[(g["rank"] <= top) | g.recommended]  # the recommendation need not have the highest median
            for r in g.itertuples():
                what = "plain (no speculation)" if r.drafter == "none" else \
                    f"{r.drafter} " + (f"k={r.k}" if r.k_policy == "fixed" else r.k_policy)
                mark = "recommended" if r.recommended else f"#{r.rank}"
                worst = getattr(r, "worst_ratio", float("nan"))
                span = f"[{r.predicted_lo:.2f}, {r.predicted_hi:.2f}]" if r.predicted_lo == r.predicted_lo else \
                    "[no interval]"
                cover = getattr(r, "unseen_coverage", float("nan"))
                unseen = (f"  unseen prompt [{r.unseen_lo:.2f}, {r.unseen_hi:.2f}] {100 * cover:.0f}%"
                          if cover == cover else "")
                lines.append(f"  {kind:10s} {mark:11s} {what:24s} predicted {r.predicted:.2f} "
                             f"{span}{unseen}  (i.i.d. formula {r.predicted_iid:.2f}"
                             + (f"; worst case {worst:.2f} of a prompt's best" if worst == worst else "") + ")")
                if r.recommended and isinstance(getattr(r, "chosen_by", None), str) and r.chosen_by:
                    lines.append(f"  {'':10s} {'':11s} chosen as {r.chosen_by}")
                if r.recommended and untrusted_text(r):
                    lines.append(f"  {'':10s} {'':11s} {untrusted_text(r)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="Print the planner's recommendation and its check.")
    ap.add_argument("--campaign", help="campaign holding the plan (default: the one whose plan finished last)")
    ap.add_argument("--top", type=int, default=3, help="configurations shown per kind (default 3)")
    ap.add_argument("--write", action="store_true", help="also store the tables in the analysis folder")
    args = ap.parse_args()
    params = load_params()
    # First the answer (analysis.answer): over every published campaign, or only the asked campaign's rows; then
    # the campaign's plan and its check.
    ans = read_answer(params["analysis_dir"])
    if ans is None:
        print("(no answer yet: run `python -m analysis.answer` or `dvc repro` for the one-screen summary)\n")
    elif args.campaign is None:
        print(render_text(ans) + "\n")
    elif len((mine := ans.only(args.campaign)).best):
        print(render_text(mine) + "\n")
    boot = bootstrap_settings(params)
    campaign = args.campaign or latest_campaign(params["outputs_dir"])
    rec = recommendation(params["outputs_dir"], campaign, boot)
    if rec is None:
        raise AnalysisError(f"campaign {campaign!r} holds no plan: run `python -m pipeline.run +sweep=plan "
                            f"campaign={campaign}`")
    plan, checked, ranking = rec.plan, rec.check, rec.ranking
    print(f"campaign {campaign}")
    print("per kind: the choice, per kind or pooled, the sample and why it stopped there, the interval for an unseen "
          "prompt (how often it holds), the held-out gain of the kind's own choice over the pooled one and its error:")
    print(markdown_table(plan_summary(plan).drop(columns=["why"])))
    print(show_plan(plan, args.top))
    for line in retime_lines(params["outputs_dir"], campaign, plan):
        print(line)
    if rec.unseen.prompts_checked.sum():
        print("\nthe plan against its check on prompts it did not see (per prompt: the median of its recommended runs "
              "over the adjacent plain run; vs_best: within-block tokens/s over the best other arm, 95% interval; "
              f"holds: at least {SHORTFALL} of it):")
        print(markdown_table(rec.unseen))
    print(record_text(rec.record))
    if not checked.empty:
        print("\ncheck in adjacent runs (median of within-block tokens/s ratios, 95% CI):")
        print(markdown_table(checked))
        print("pooled speed-up over plain, every arm:")
        print(markdown_table(ranking))
    if args.write:
        out = Path(params["analysis_dir"])
        save_table(plan.drop(columns=["campaign"], errors="ignore"), out / "recommendation.parquet")
        save_table(checked, out / "recommendation_check.parquet")
        save_table(ranking, out / "recommendation_ranking.parquet")
        save_table(rec.unseen, out / "recommendation_unseen.parquet")
        save_table(plan_summary(plan), out / "recommendation_summary.parquet")
        save_table(rec.history, out / "recommendation_history.parquet")
        # The track record for `dvc metrics show outputs/metrics/detail/planner.json` (JSON has no NaN: null)
        record = {k: None if v != v else v for k, v in rec.record.items()}
        save_json({"campaign": campaign, **record}, Path(params["metrics_dir"]) / "detail" / "planner.json")


if __name__ == "__main__":
    run_script("analysis.recommend", main)
