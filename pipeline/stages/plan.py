"""Stage plan: from this job's timing and acceptance results, a predicted speed-up for every
configuration tried (drafter, k policy, k) per prompt kind, and the recommended one per kind.

Runs as the last part of ``stage=plan`` (parts timing, acceptance, plan), so the time model is
calibrated on timings taken minutes before the acceptance runs it replays. Nothing here runs a model.
"""
from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig

from pipeline.jobs.context import StageContext
from store.records import make_schema
from pipeline.engines.base import DEFAULT_ENGINE, engine_class
from speclab.specs.arms import Arm
from speclab.costs.planning import recommend, run_noise
from speclab.stats.intervals import prediction_size_needed
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, TRUST_FIELDS, identity
from pipeline.jobs.trust import inherited
from store.plan_check import TRUSTED, retime_command, untrusted_text
from pipeline.jobs.run_names import run_name
from pipeline.stages.plan_sample import engine_name, kinds_settled, predictions, sample_looks, stop_reason, this_job

SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("kind", "string"), ("drafter", "string"), ("k_policy", "string"), ("k", "int32"), ("prompts", "int32"),
    ("predicted", "float64"), ("predicted_lo", "float64"), ("predicted_hi", "float64"),
    ("predicted_iid", "float64"), ("alpha", "float64"), ("rank", "int32"), ("recommended", "bool"),
    ("level", "float64"), ("prompt_ids", "string"), ("worst_ratio", "float64"), ("chosen_by", "string"),
    ("unseen_lo", "float64"), ("unseen_hi", "float64"), ("unseen_coverage", "float64"),
    ("cv_gain", "float64"), ("cv_error", "float64"),
    # Why the kind's sample is its size (pipeline/stages/plan_sample.py), and the recommendation's lower bound over
    # its closest rival (a ratio, at the level corrected for the rivals and looks; speclab.costs.sample_rule).
    ("sample_stop", "string"), ("runner_up_margin", "float64"),
] + TRUST_FIELDS)
NEEDS = ("timing", "acceptance")


def run(ctx: StageContext) -> StageOutput:
    cfg = ctx.cfg
    timing, acc = (this_job(cfg, s) for s in NEEDS)
    trust, detail = inherited({"timing": timing, "acceptance": acc})
    if trust not in TRUSTED and bool(cfg.trust.strict):
        raise ValueError(f"trust.strict=true: the plan's measurements are untrusted ({detail}): {retime_text(cfg)}")
    level = float(cfg.stage.level)
    pred = predictions(engine_name(ctx), timing, acc)
    rec = recommend(pred, level, run_noise(timing))
    precision = cfg.stage.get("sample_precision")
    state = kinds_settled(pred, rec, float(precision) if precision is not None else 0.0, level, sample_looks(cfg))
    seen = set(acc.prompt_id)
    sample = {k: (state.get(k), int(n)) for k, n in acc.groupby("kind").prompt_id.nunique().items()}
    rec["sample_stop"] = [stop_reason(cfg, k, *sample[k], seen) if k in sample else "" for k in rec.kind]
    rec["runner_up_margin"] = [sample[k][0].margin if k in sample and sample[k][0] is not None else float("nan")
                               for k in rec.kind]
    rows = rec.assign(**identity(ctx), level=level, prompt_ids=",".join(sorted(acc.prompt_id.unique())),
                      trust=trust, trust_detail=detail)
    return summarize(rows, cfg)


def retime_text(cfg: DictConfig) -> str:
    """The command that measures the plan again, alone on the machine."""
    from pipeline.jobs.results import hydra_overrides

    return retime_command(hydra_overrides() or [])


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "plan")


def choice_text(r) -> str:
    if r.drafter == "none":
        return "plain decoding (no speculation)"
    engine = str(getattr(r, "engine", DEFAULT_ENGINE))
    said = engine_class(engine).arm_text(Arm("speculative", int(r.k) or None, str(r.k_policy), str(r.drafter), engine))
    if said is not None:  # how a user writes it for that engine (the flags of its command)
        return said
    policy = "" if r.k_policy == "fixed" else f" {r.k_policy}"
    k = f" k={r.k}" if r.k_policy == "fixed" else ""
    return f"{r.drafter}{policy}{k}"


def interval_text(row) -> str:
    if row.predicted_lo != row.predicted_lo:
        return f"no {100 * row.level:.0f}% interval from {row.prompts} prompts"
    return f"{100 * row.level:.0f}% interval {row.predicted_lo:.2f}-{row.predicted_hi:.2f}"


def unseen_text(row) -> str:
    """Where an unseen prompt of the kind falls, and how often that holds."""
    cover = getattr(row, "unseen_coverage", float("nan"))
    if cover != cover:
        return "no interval for an unseen prompt"
    need = "" if cover >= row.level - 1e-9 else f"; {100 * row.level:.0f}% needs {prediction_size_needed(row.level)} prompts"
    return f"an unseen prompt {row.unseen_lo:.2f}-{row.unseen_hi:.2f} ({100 * cover:.0f}% of the time{need})"


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """The recommendation per kind (child runs), and every kind's best on the job run."""
    arms, summary, metrics = [], [], {}
    for kind, g in df.groupby("kind", sort=True):
        best = g[g.recommended].iloc[0]
        fixed = g[(g.k_policy == "fixed") & (g.drafter == "model")]
        runner = g[~g.recommended].sort_values("predicted", ascending=False)
        arms.append(ArmResult(f"recommended {kind}", {"kind": kind, "drafter": best.drafter,
                                                      "k_policy": best.k_policy, "k": int(best.k)},
                              {"predicted_speedup": best.predicted, "predicted_lo": best.predicted_lo,
                               "predicted_hi": best.predicted_hi, "prompts": int(best.prompts),
                               "worst_ratio": best.worst_ratio,
                               **{c: getattr(best, c, float("nan")) for c in ("unseen_lo", "unseen_hi", "unseen_coverage",
                                                                               "cv_gain", "cv_error", "runner_up_margin")}}))
        metrics[f"predicted_speedup_{kind}"] = float(best.predicted)
        metrics[f"sample_prompts_{kind}"] = float(best.prompts)
        summary.append(f"{kind}: recommended {choice_text(best)}: predicted speed-up {best.predicted:.2f} "
                       f"({interval_text(best)}, {unseen_text(best)}, "
                       f"{best.prompts} prompts; {best.chosen_by})"
                       + (f"; highest other median {choice_text(runner.iloc[0])} {runner.iloc[0].predicted:.2f}" if len(runner) else "")
                       + (f"; best draft-model fixed k={int(fixed.loc[fixed.predicted.idxmax()].k)} "
                          f"{fixed.predicted.max():.2f}" if len(fixed) else "")
                       + (f"; sample: {best.sample_stop}" if getattr(best, "sample_stop", "") else "")
                       + (f"; {untrusted_text(best)}" if untrusted_text(best) else ""))
    if untrusted_text(df.iloc[0]):
        summary.append(f"{untrusted_text(df.iloc[0])}: {retime_text(cfg)}")
    summary.append("print it any time with: python -m analysis.recommend")
    return StageOutput(df, metrics, summary, arms)
