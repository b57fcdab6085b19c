"""A plan's statement per kind against its check's speed runs on prompts the plan did not see: the measured
speed-up of the recommendation beside the plan's prediction interval for an unseen prompt (inside or not, per kind
and per prompt), and the recommendation against the best arm measured beside it (the median of within-block
tokens/s ratios and its distribution-free interval). The analysis (analysis.recommend) and a check job's own MLflow
run (the speed stage) read the same rows; over a campaign's checks the share inside is the planner's track record.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from speclab.specs.arms import Arm
from speclab.stats.intervals import median_ci
from store.best_fixed import BLOCK

COLUMNS = ["pair", "kind", "choice", "predicted", "unseen_lo", "unseen_hi", "stated_coverage", "sample_prompts",
           "prompts_checked", "measured", "measured_inside", "inside", "inside_share", "best_arm", "best_measured",
           "vs_best", "vs_best_lo", "vs_best_hi", "blocks", "told_apart", "holds"]
SHORTFALL = 0.95  # the recommendation holds when at least this share of the best arm's speed-up


TRUSTED = ("ok", "unchecked")  # a job's checks passed, or ran before the checks existed (pipeline/jobs/trust.py)


def untrusted_text(row) -> str:
    """What a plan row says of the timing and acceptance it priced: "" when trusted (or written before the checks),
    else ``UNTRUSTED (<checks>: <reasons>)``."""
    trust = getattr(row, "trust", "ok")
    trust = "ok" if trust != trust or trust is None else str(trust)
    if trust in TRUSTED:
        return ""
    return f"UNTRUSTED ({trust}: {getattr(row, 'trust_detail', '')})"


def retime_command(overrides: list[str]) -> str:
    """The command that measures a plan again from its job's overrides, to run alone on the machine."""
    given = [o for o in overrides if not o.startswith("force=")]
    return "retime it alone on a quiet machine: python -m pipeline.run " + " ".join([*given, "force=true"])


def plan_prompts(plan: pd.DataFrame) -> set[str]:
    """The prompts a plan saw (its rows' ``prompt_ids``)."""
    return {p for ids in plan.prompt_ids.dropna().unique() for p in str(ids).split(",") if p}


def _label(rows: pd.DataFrame) -> pd.Series:
    return pd.Series([Arm.from_row(r).label for r in rows.itertuples()], index=rows.index, dtype=object)


def block_ratios(runs: pd.DataFrame, a: pd.Series, b: pd.Series) -> np.ndarray:
    """tokens/s of arm rows ``a`` over arm rows ``b`` in the same block (one per block and round)."""
    x = runs[a].groupby(BLOCK).tokens_per_s.median()
    y = runs[b].groupby(BLOCK).tokens_per_s.median()
    both = x.index.intersection(y.index)
    return (x[both] / y[both]).to_numpy()


def kind_checks(speed: pd.DataFrame, plan: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per pair and kind of ``plan`` (one plan's rows): the check on the prompts the plan did not see (``speed``: the
    runs of jobs that followed this plan; prompts the plan saw are left out).

    ``measured``: the median over checked prompts of each prompt's median recommended run over its adjacent plain
    run; ``measured_inside``: whether it lies in the plan's interval for an unseen prompt, ``inside``: how many
    prompts did (``stated_coverage`` is how often the plan said one would). ``best_arm``: of the other configurations
    run in the same blocks (an arm of the recommendation's own configuration is its noise), the highest median
    speed-up; ``vs_best``: the recommendation over it, the median of their
    within-block tokens/s ratios, with its distribution-free interval at ``level`` (none from fewer blocks than it
    needs). ``told_apart``: the plan's recommendation was, at its level, above every rival (``runner_up_margin``
    at least 1). ``holds``: ``vs_best`` is at least ``SHORTFALL``, whatever the plan said: a plan unsure of its
    runner-up is not excused when another configuration won."""
    seen = plan_prompts(plan)
    rows = []
    runs_all = speed[~speed.prompt_id.isin(seen)] if len(speed) else speed
    for r in plan[plan.recommended & (plan.kind != "all")].itertuples():
        runs = runs_all[(runs_all.pair == r.pair) & (runs_all.kind == r.kind)] if len(runs_all) else runs_all
        rec = runs[runs.arm == "recommended"] if len(runs) else runs
        per_prompt = rec.groupby("prompt_id").ratio_to_adjacent_plain.median() if len(rec) else pd.Series(dtype=float)
        lo, hi = getattr(r, "unseen_lo", np.nan), getattr(r, "unseen_hi", np.nan)
        stated = lo == lo and len(per_prompt) > 0
        measured = float(per_prompt.median()) if len(per_prompt) else np.nan
        inside = int(((per_prompt >= lo) & (per_prompt <= hi)).sum()) if stated else 0
        best, best_speedup, ratio, r_lo, r_hi, blocks = "", np.nan, np.nan, np.nan, np.nan, 0
        if len(rec):
            same = runs.merge(rec[BLOCK].drop_duplicates(), on=BLOCK)
            # Another arm running the recommendation's own configuration is its noise, not a rival.
            mine = (same.drafter == r.drafter) & (same.k_policy == r.k_policy) & (same.k == int(r.k))
            others = same[~same.arm.isin(["plain", "recommended"]) & ~mine]
            if len(others):
                labels = _label(others)
                speedups = others.groupby(labels).ratio_to_adjacent_plain.median()
                best, best_speedup = str(speedups.idxmax()), float(speedups.max())
                labelled = same.assign(label=_label(same))
                ratios = block_ratios(labelled, labelled.arm == "recommended", labelled.label == best)
                blocks = len(ratios)
                ratio = float(np.median(ratios)) if blocks else np.nan
                r_lo, r_hi = median_ci(ratios, level) if blocks else (np.nan, np.nan)
        margin = getattr(r, "runner_up_margin", np.nan)
        told_apart = bool(margin == margin and margin >= 1.0)
        rows.append({"pair": r.pair, "kind": r.kind,
                     "choice": Arm("speculative", int(r.k) or None, str(r.k_policy), str(r.drafter)).label,
                     "predicted": float(r.predicted), "unseen_lo": lo, "unseen_hi": hi,
                     "stated_coverage": getattr(r, "unseen_coverage", np.nan), "sample_prompts": int(r.prompts),
                     "prompts_checked": len(per_prompt), "measured": measured,
                     "measured_inside": bool(lo <= measured <= hi) if stated else np.nan,
                     "inside": inside if stated else np.nan,
                     "inside_share": inside / len(per_prompt) if stated else np.nan,
                     "best_arm": best, "best_measured": best_speedup, "vs_best": ratio, "vs_best_lo": r_lo,
                     "vs_best_hi": r_hi, "blocks": blocks, "told_apart": told_apart,
                     "holds": bool(ratio >= SHORTFALL) if ratio == ratio else np.nan})
    return pd.DataFrame(rows, columns=COLUMNS)


def track_record(checks: pd.DataFrame) -> dict[str, float]:
    """Over checks (``kind_checks`` rows of every plan of a campaign): how many kinds were checked, the share whose
    measured speed-up fell inside the stated interval, the share of checked prompts that did beside the coverage the
    plans stated, and the share of kinds whose recommendation held against the best measured arm."""
    done = checks[checks.prompts_checked > 0] if len(checks) else checks
    stated = done[done.inside.notna()] if len(done) else done
    prompts = float(stated.prompts_checked.sum()) if len(stated) else 0.0
    return {"checks": float(len(done)),
            "inside_share": float(stated.measured_inside.astype(float).mean()) if len(stated) else np.nan,
            "prompts_checked": prompts,
            "prompts_inside_share": float(stated.inside.sum() / prompts) if prompts else np.nan,
            "stated_coverage": float(np.average(stated.stated_coverage, weights=stated.prompts_checked))
            if prompts else np.nan,
            "holds_share": float(done.holds.dropna().astype(float).mean()) if done.holds.notna().any() else np.nan}
