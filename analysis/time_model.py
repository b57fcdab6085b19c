"""The time model validated: predicted vs measured speed-up per kind and k, on prompts held out of
its calibration, beside the chapter's i.i.d. formula; where the time goes; exercise 4's numbers.

    python -m analysis.time_model     (reads params.yaml: time_model.campaign)

Calibration: the timing rows and the acceptance rows (their loop times) of the prompts the timing
stage timed, i.e. the planner's sample (`+sweep=plan`: the first two prompts of each kind).
Validation: the speed stage's adjacent-run ratios on every other prompt. Nothing is fitted on the
speed stage. Two predictions are made for each held-out (kind, k):
- "own acceptance": the time model replays each held-out prompt's own acceptance run (what a user
  who ran the cheap acceptance stage on their prompts gets);
- "kind sample": the time model replays the calibration prompts of the same kind (what the planner
  predicts for prompts it has not seen).
Same concept, other floor: ``speclab/costs/time_model.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, read_stage, run_script, save_csv,
                             save_figure, save_json, save_table, speedup_panels)
from analysis.inputs import AnalysisError
from analysis.palette import PREDICTOR_COLORS, kind_color
from speclab.stats.estimators import alpha_hat
from speclab.costs.planning import calibrate, predict_at_blocks, predict_runs
from speclab.costs.time_model import PARTS, TimeModel

ALL = "all"
PREDICTORS = {"tm_own": "time model, own acceptance", "tm_kind": "time model, kind sample",
              "tm_block": "time model, own acceptance, at each block's step times",
              "iid_own": "i.i.d. formula, own acceptance", "iid_kind": "i.i.d. formula, kind sample",
              "iid_block": "i.i.d. formula, own acceptance, at each block's step times"}
MEASURED_PARTS = {"prefill": "prefill_s", "draft": "draft_s_per_iter", "verify": "verify_s_per_iter",
                  "rollback": "rollback_s_per_iter", "bookkeeping": "bookkeeping_s_per_iter"}


def loop_iterations(speed: pd.DataFrame) -> pd.Series:
    """Iterations of each speed run that its per-iteration times cover: a merged prefill's first
    iteration counts in prefill_s instead (files without the column prefilled apart)."""
    if "merged_prefill" not in speed:
        return speed.iterations
    return speed.iterations - speed.merged_prefill.fillna(False).astype(int)


def model_fixed(df: pd.DataFrame) -> pd.DataFrame:
    """The draft model at a fixed k, greedy: what the chapter's formula describes."""
    return df[~df.do_sample & (df.drafter == "model") & (df.k_policy == "fixed")]


def one_job_per_run(acc: pd.DataFrame) -> pd.DataFrame:
    """The rows of one job for each run (prompt, drafter, policy, k): a prompt measured by several jobs at the
    same settings (a stage-all job and a draft comparison, say) is replayed once, from the same job each time
    (the smallest config hash)."""
    keys = ["prompt_id", "kind", "drafter", "k_policy", "k"]
    return acc[acc.config_hash == acc.groupby(keys).config_hash.transform("min")]


def with_all(df: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([df, df.assign(kind=ALL)], ignore_index=True)


def iid_by_kind(model: TimeModel, acc: pd.DataFrame) -> pd.DataFrame:
    """The i.i.d. formula per (kind, k): alpha-hat pooled over the rows, c_draft and c_verify(k) from the timing stage."""
    rows = []
    for (kind, k), g in with_all(acc).groupby(["kind", "k"]):
        a = alpha_hat(g.accepted, g.proposed)
        rows.append({"kind": kind, "k": int(k), "alpha": a, "iid": model.iid(a, int(k))})
    return pd.DataFrame(rows)


def points_table(model: TimeModel, acc_cal: pd.DataFrame, acc_held: pd.DataFrame, speed_held: pd.DataFrame,
                 boot: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (kind, k): measured on held-out prompts, each predictor with an interval; and the per-run predictions."""
    own, kind = predict_runs(model, acc_held), predict_runs(model, acc_cal)
    iid_own, iid_kind = iid_by_kind(model, acc_held), iid_by_kind(model, acc_cal)
    at_blocks = predict_at_blocks(model, acc_held, speed_held)
    speed_held = speed_held.assign(tm_block=at_blocks.predicted, iid_block=at_blocks.predicted_iid)
    rows = []
    for (kd, k), g in with_all(speed_held).groupby(["kind", "k"], sort=True):
        ratios = g.ratio_to_adjacent_plain.to_numpy()
        lo, hi = bootstrap_ci(ratios, np.median, **boot)
        row = {"kind": kd, "k": int(k), "runs": len(g), "prompts": g.prompt_id.nunique(),
               "measured": float(np.median(ratios)), "measured_lo": lo, "measured_hi": hi}
        # Priced at each block's own step times: one prediction per run, summarised like the measurement.
        for name in ("tm_block", "iid_block"):
            p = g[name].dropna().to_numpy()
            plo, phi = bootstrap_ci(p, np.median, **boot)
            row.update({name: float(np.median(p)) if len(p) else np.nan, f"{name}_lo": plo, f"{name}_hi": phi,
                        f"{name}_runs": len(p)})
        for name, pred in (("tm_own", own), ("tm_kind", kind)):
            p = pred[(pred.k == k) & ((pred.kind == kd) | (kd == ALL))].predicted.to_numpy()
            med, plo, phi = (float(np.median(p)), *bootstrap_ci(p, np.median, **boot)) if len(p) else (np.nan,) * 3
            row.update({name: med, f"{name}_lo": plo, f"{name}_hi": phi})
        for name, tab in (("iid_own", iid_own), ("iid_kind", iid_kind)):
            hit = tab[(tab.kind == kd) & (tab.k == k)]
            row[name] = float(hit.iid.iloc[0]) if len(hit) else np.nan
        rows.append(row)
    return pd.DataFrame(rows), own


def error_table(points: pd.DataFrame) -> pd.DataFrame:
    """Absolute error of each predictor: mean and max over k, per kind and over the three kinds."""
    per_kind = points[points.kind != ALL]
    rows = []
    for kd, g in list(per_kind.groupby("kind", sort=True)) + [("every kind", per_kind)]:
        for name, label in PREDICTORS.items():
            err = (g[name] - g.measured).abs()
            rows.append({"kind": kd, "predictor": label, "points": int(err.notna().sum()),
                         "mae": float(err.mean()), "max_abs_error": float(err.max()),
                         "mean_signed_error": float((g[name] - g.measured).mean())})
    return pd.DataFrame(rows)


def decomposition(own: pd.DataFrame, speed_held: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per generated token by part, predicted (time model) and measured (the loop's own
    stopwatches in the speed runs), per kind and k, averaged over held-out runs."""
    pred = own.assign(**{f"{p}_ms": 1e3 * own[f"{p}_s"] / own.tokens for p in PARTS})
    pred = pred.assign(prefill_ms=pred.prefill_target_ms + pred.prefill_draft_ms)
    pred = pred.groupby(["kind", "k"])[["prefill_ms", "draft_steps_ms", "catch_up_ms", "verify_ms", "rollback_ms",
                                         "bookkeeping_ms"]].mean().reset_index()
    # A merged prefill's first iteration is in prefill_s, and its per-iteration times cover the others.
    s = speed_held.assign(iterations=loop_iterations(speed_held))
    meas = s.assign(prefill_ms=1e3 * s.prefill_s / s.new_tokens,
                    draft_steps_ms=1e3 * s.draft_s_per_iter * s.iterations / s.new_tokens, catch_up_ms=0.0,
                    verify_ms=1e3 * s.verify_s_per_iter * s.iterations / s.new_tokens,
                    rollback_ms=1e3 * s.rollback_s_per_iter * s.iterations / s.new_tokens,
                    bookkeeping_ms=1e3 * s.bookkeeping_s_per_iter * s.iterations / s.new_tokens,
                    wall_ms=1e3 * s.wall_s / s.new_tokens)
    meas = meas.groupby(["kind", "k"])[["prefill_ms", "draft_steps_ms", "catch_up_ms", "verify_ms", "rollback_ms",
                                         "bookkeeping_ms", "wall_ms"]].mean().reset_index()
    return pd.concat([pred.assign(source="predicted"), meas.assign(source="measured")], ignore_index=True)


DECOMP_PARTS = {"prefill_ms": "prefills (both models)", "draft_steps_ms": "draft steps",
                "catch_up_ms": "draft catch-up (measured: inside draft)", "verify_ms": "verification",
                "rollback_ms": "rollback", "bookkeeping_ms": "bookkeeping"}


def decomposition_figure(dec: pd.DataFrame):
    kinds = sorted(dec.kind.unique())
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.6 * len(kinds), 4), sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, kd in zip(axes[0], kinds):
        for j, (source, hatch, dx) in enumerate((("predicted", "//", -0.2), ("measured", "", 0.2))):
            g = dec[(dec.kind == kd) & (dec.source == source)].sort_values("k")
            bottom = np.zeros(len(g))
            for i, (col, label) in enumerate(DECOMP_PARTS.items()):
                ax.bar(g.k + dx, g[col], 0.38, bottom=bottom, color=colors[i], hatch=hatch, edgecolor="white",
                       label=label if (j == 1 and kd == kinds[0]) else None)
                bottom += g[col].to_numpy()
        ax.set_title(kd, color=kind_color(kd))
        ax.set_xlabel("k")
    axes[0][0].set_ylabel("ms per generated token")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Where a speculative run's time goes (held-out prompts, draft model, fixed k)\n"
                 "each k: left bar predicted by the time model (hatched), right bar measured", fontsize=10)
    fig.tight_layout()
    return fig


def points_figure(points: pd.DataFrame):
    def draw(ax, g):
        ax.errorbar(g.k + 0.1, g.tm_own, yerr=[g.tm_own - g.tm_own_lo, g.tm_own_hi - g.tm_own], fmt="^:", capsize=2,
                    label=PREDICTORS["tm_own"], color=PREDICTOR_COLORS[0])
        ax.plot(g.k - 0.1, g.tm_kind, "v:", label=PREDICTORS["tm_kind"], color=PREDICTOR_COLORS[1])
        ax.plot(g.k, g.iid_own, "s--", label=PREDICTORS["iid_own"], color=PREDICTOR_COLORS[2])
        if g.tm_block.notna().any():
            ax.errorbar(g.k + 0.2, g.tm_block, yerr=[g.tm_block - g.tm_block_lo, g.tm_block_hi - g.tm_block], fmt="D-",
                        capsize=2, label=PREDICTORS["tm_block"], color=PREDICTOR_COLORS[3])
    kinds = [k for k in sorted(points.kind.unique()) if k != ALL] + [ALL]
    return speedup_panels(points, kinds, draw, "Time model vs i.i.d. formula on held-out prompts", legend_size=6)


def exercise4(model: TimeModel, acc: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """Why the formula misses, per kind and k, split into factors that multiply to predicted_iid / measured:
    tokens per pass (formula at alpha-hat vs counted), iteration time (counted vs k draft steps + one
    check), prefills and the plain run's own steps."""
    t, d, ref = model.target, model.draft, model.target.ctx_ref
    rows = []
    for (kd, k), g in with_all(speed).groupby(["kind", "k"], sort=True):
        a = acc[(acc.k == k) & ((acc.kind == kd) | (kd == ALL))]
        alpha = alpha_hat(a.accepted, a.proposed)
        tpp_formula = float((1 - alpha ** (k + 1)) / (1 - alpha)) if alpha < 1 else k + 1.0
        tpp = float((g.new_tokens / g.iterations).mean())
        iter_formula = k * float(d.time(1, ref)) + float(t.time(k + 1, ref))
        iter_meas = float(((g.wall_s - g.prefill_s) / loop_iterations(g)).mean())
        draft_meas = float(g.draft_s_per_iter.mean())
        rows.append({"kind": kd, "k": int(k), "alpha": alpha, "bonus_share": float(a.bonus.mean()),
                     "tokens_per_pass": tpp, "tokens_per_pass_formula": tpp_formula,
                     "draft_ms_per_iter": 1e3 * draft_meas, "draft_ms_formula": 1e3 * k * float(d.time(1, ref)),
                     "iteration_ms": 1e3 * iter_meas, "iteration_ms_formula": 1e3 * iter_formula,
                     "prefill_share": float((g.prefill_s / g.wall_s).mean()),
                     "tokens_factor": tpp_formula / tpp, "iteration_factor": iter_meas / iter_formula})
    return pd.DataFrame(rows)


def calibration_job(timing: pd.DataFrame, acc: pd.DataFrame, job: str | None, campaign: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The timing rows of the one plan job the model is calibrated on, and the acceptance rows without
    the other timing jobs' runs on its prompts (a campaign whose plan was remade holds the same calibration
    runs twice); their runs on other prompts stay, to be replayed for the held-out speed runs.
    ``job``: that job's config hash (``params.yaml: time_model.calibration_job``), needed only when the
    campaign holds several."""
    jobs = sorted(set(timing.config_hash))
    if job is None and len(jobs) > 1:
        raise AnalysisError(f"campaign {campaign!r} holds timing results of {len(jobs)} jobs ({', '.join(jobs)}): "
                            "name the calibration in params.yaml, time_model.calibration_job: <one of them>")
    job = job or jobs[0]
    if job not in jobs:
        raise AnalysisError(f"time_model.calibration_job={job!r} is not a timing job of campaign {campaign!r}: "
                            f"use one of {jobs}")
    timing = timing[timing.config_hash == job]
    duplicate = acc.config_hash.isin(set(jobs) - {job}) & acc.prompt_id.isin(set(timing.prompt_id))
    return timing, acc[~duplicate]


@dataclass(frozen=True)
class Validation:
    """A time model calibrated on one job's prompts and its predictions for the held-out speed runs."""

    model: TimeModel
    calibration_prompts: set[str]
    acc: pd.DataFrame      # acceptance rows of the draft model at fixed k, greedy (calibration job's and held-out)
    held: pd.DataFrame     # speculative speed runs (draft model, fixed k, greedy) on held-out prompts
    points: pd.DataFrame   # points_table: measured and every predictor per (kind, k)
    own: pd.DataFrame      # per-run predictions replaying each held-out prompt's own acceptance run
    errors: pd.DataFrame   # error_table of points


def validate(timing: pd.DataFrame, acc: pd.DataFrame, speed: pd.DataFrame, job: str | None, campaign: str,
             boot: dict) -> Validation:
    """Calibrate on the timing job ``job`` (``calibration_job``) and predict the speed runs on the other prompts;
    one pair's rows. AnalysisError when the rows cannot calibrate a model or hold no held-out run."""
    timing, acc = calibration_job(timing, acc, job, campaign)
    calib = set(timing.prompt_id)
    acc_cal = acc[acc.prompt_id.isin(calib)]
    if acc_cal.empty:
        raise AnalysisError(f"campaign {campaign!r} has no acceptance runs on the calibration prompts {sorted(calib)}")
    try:
        model = calibrate(timing, acc_cal)
    except ValueError as err:
        raise AnalysisError(f"campaign {campaign!r}: {err}") from None
    acc_mf = one_job_per_run(model_fixed(acc))
    held = model_fixed(speed[speed.arm == "speculative"])
    held = held[~held.prompt_id.isin(calib)]
    if held.empty:
        raise AnalysisError(f"campaign {campaign!r} has no speed runs on prompts outside the calibration sample "
                            f"{sorted(calib)}: nothing to validate on")
    acc_held = acc_mf[~acc_mf.prompt_id.isin(calib)]
    if acc_held.empty or acc_held.kind.nunique() < held.kind.nunique():
        raise AnalysisError(f"campaign {campaign!r} has no greedy fixed-k acceptance runs of the draft model on "
                            "the held-out prompts of every kind: nothing to replay")
    points, own = points_table(model, acc_mf[acc_mf.prompt_id.isin(calib)], acc_held, held, boot)
    return Validation(model, calib, acc_mf, held, points, own, error_table(points))


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    boot = bootstrap_settings(params)
    campaign = params["time_model"]["campaign"]
    timing, acc, speed = (read_stage(params["outputs_dir"], s, campaign) for s in ("timing", "acceptance", "speed"))
    if timing.empty or acc.empty or speed.empty:
        raise AnalysisError(f"needs timing, acceptance and speed results in campaign {campaign!r}: run "
                            f"`python -m pipeline.run +sweep=plan campaign={campaign}`, the held-out acceptance "
                            f"and `+sweep=check_plan` (docs/planner.md)")
    v = validate(timing, acc, speed, params["time_model"].get("calibration_job"), campaign, boot)
    model, calib, acc_mf, held, points, own, errors = (v.model, v.calibration_prompts, v.acc, v.held, v.points, v.own,
                                                      v.errors)
    dec = decomposition(own, held)
    ex4 = exercise4(model, acc_mf, model_fixed(speed[speed.arm == "speculative"]))
    calibration = pd.DataFrame([{
        "campaign": campaign, "calibration_prompts": ",".join(sorted(calib)),
        "held_out_prompts": ",".join(sorted(held.prompt_id.unique())),
        "target_scale": model.loop.target_scale, "draft_scale": model.loop.draft_scale,
        "lookup_ms": 1e3 * model.loop.lookup_s, "rollback_ms": 1e3 * model.loop.rollback_s,
        "bookkeeping_ms": 1e3 * model.loop.bookkeeping_s,
        "target_step_ms": 1e3 * float(model.target.time(1, model.target.ctx_ref)),
        "draft_step_ms": 1e3 * float(model.draft.time(1, model.target.ctx_ref)),
        "context_ref": model.target.ctx_ref,
        "target_ms_per_context_token": 1e3 * model.target.slope[1], "draft_ms_per_context_token": 1e3 * model.draft.slope[1],
    }])
    every = errors[errors.kind == "every kind"].set_index("predictor")
    metrics = {"campaign": campaign,
               "max_abs_error_time_model": float(every.loc[PREDICTORS["tm_own"], "max_abs_error"]),
               "mae_time_model": float(every.loc[PREDICTORS["tm_own"], "mae"]),
               "mae_time_model_kind_sample": float(every.loc[PREDICTORS["tm_kind"], "mae"]),
               "mae_iid": float(every.loc[PREDICTORS["iid_own"], "mae"]),
               "mae_iid_kind_sample": float(every.loc[PREDICTORS["iid_kind"], "mae"]),
               "max_abs_error_time_model_block": float(every.loc[PREDICTORS["tm_block"], "max_abs_error"]),
               "mae_time_model_block": float(every.loc[PREDICTORS["tm_block"], "mae"]),
               "mae_iid_block": float(every.loc[PREDICTORS["iid_block"], "mae"])}
    figures = {"time_model_speedup.png": points_figure(points), "time_model_decomposition.png": decomposition_figure(dec)}
    # Everything is computed; only now are outputs replaced (each atomically).
    for name, df in (("time_model_points", points), ("time_model_errors", errors), ("time_model_decomposition", dec),
                     ("time_model_exercise4", ex4), ("time_model_calibration", calibration)):
        save_table(df, out / f"{name}.parquet")
    # `series` is the kind (colour, analysis.palette), `predictor` the marker shape (template predicted_vs_measured).
    long = pd.concat([points[points.kind != ALL][["kind", "k", "measured"]].assign(predictor=label, predicted=points[col])
                      for col, label in PREDICTORS.items()], ignore_index=True)
    save_csv(long.assign(series=long.kind)[["series", "kind", "predictor", "k", "predicted", "measured"]],
             Path(params["metrics_dir"]) / "plots" / "time_model_predictions.csv")
    save_json(metrics, Path(params["metrics_dir"]) / "detail" / "time_model.json")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    print(errors.to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.time_model", main)
