"""Batches: where the flatness of the target's pass ends, and where speculation stops paying.

    python -m analysis.batch   (reads the published campaign's batch and acceptance results; writes
                                outputs/analysis/batch_costs.parquet, batch_speedups.parquet,
                                batch_model_error.parquet, outputs/metrics/detail/batch.json and two figures)

Two predictions of each batched speed-up:
- the chapter's formula at B: costs in units of one batched target step T(B, 1) (B rows, one new
  token each), c_draft(B) = D(B, 1) / T(B, 1), c_verify(B, k) = T(B, k + 1) / T(B, 1); one iteration
  yields, per row, (1 - a^(k+1)) / (1 - a) tokens for that row's acceptance rate a, averaged over
  the rows, divided by k c_draft(B) + c_verify(B, k);
- the time model at B (``speclab.costs.batch_time_model``, the batch-1 planner's model run in lockstep):
  each row replays its greedy acceptance run (the acceptance stage's, at the same k), finished rows
  leave the batch, every pass is priced from the job's own pass rows over rows x new tokens, with
  the draft's catch-up and both prefills. What the batch stage does not time is calibrated on the
  *other* blocks of the same job, never on the run it predicts: the prefills' cost per padded
  prompt token (their runs' ``prefill_s``) and the loop's costs at that B (in-loop over isolated
  pass time, rollback and bookkeeping per iteration: their per-iteration stopwatches). The
  ``no_loop`` variant leaves the loop's costs out.
Same concept, other floors: ``pipeline/stages/batch.py``, ``speclab/decoding/batch.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (
    AnalysisError, bootstrap_ci, load_params, published_campaign, read_stage, run_script, save_figure, save_json,
    save_table,
)
from speclab.costs.batch_time_model import BatchPassModel, BatchTimeModel, BatchTrace, calibrate_batch_loop, fit_prefill
from speclab.costs.cost_model import break_even_alpha, expected_tokens_per_iteration
from speclab.costs.time_model import Trace

PREDICTORS = {"predicted": "formula", "predicted_time_model": "time_model", "predicted_no_loop": "no_loop"}


def batch_costs(passes: pd.DataFrame) -> pd.DataFrame:
    """Per pair and B: target step, draft step, c_draft(B) and c_verify(B, n - 1) for each pass length n."""
    med = passes.groupby(["pair", "batch_size", "model", "pass_len"]).median_s.median()
    rows = []
    for (pair, b), _ in passes.groupby(["pair", "batch_size"]):
        t1, d1 = med[(pair, b, "target", 1)], med.get((pair, b, "draft", 1), np.nan)
        for n in sorted(passes[(passes.pair == pair) & (passes.batch_size == b) & (passes.model == "target")].pass_len):
            rows.append({"pair": pair, "batch_size": int(b), "pass_len": int(n), "k": int(n) - 1,
                         "target_pass_ms": 1e3 * med[(pair, b, "target", n)], "target_step_ms": 1e3 * t1,
                         "draft_step_ms": 1e3 * d1, "c_draft": d1 / t1, "c_verify": med[(pair, b, "target", n)] / t1,
                         "ms_per_row_token": 1e3 * med[(pair, b, "target", n)] / (int(b) * int(n))})
    return pd.DataFrame(rows).drop_duplicates(["pair", "batch_size", "pass_len"])


def batch_speedups(runs: pd.DataFrame, costs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair, B and k: measured speed-up over the adjacent batched plain run (median, interval) vs predicted."""
    rows = []
    spec = runs[runs.arm == "speculative"]
    for (pair, b, k), sub in spec.groupby(["pair", "batch_size", "k"]):
        c = costs[(costs.pair == pair) & (costs.batch_size == b) & (costs.k == k)]
        row_alpha = np.array([a for s in sub.row_acceptance for a in json.loads(s) if a is not None], dtype=float)
        tokens = float(np.mean(expected_tokens_per_iteration(np.clip(row_alpha, 0, 1), int(k)))) if len(row_alpha) else np.nan
        cd, cv = (float(c.c_draft.iloc[0]), float(c.c_verify.iloc[0])) if len(c) else (np.nan, np.nan)
        lo, hi = bootstrap_ci(sub.ratio_to_adjacent_plain.to_numpy(), samples=int(boot["samples"]),
                              seed=int(boot["seed"]), level=float(boot["level"]))
        pooled = float(sub.acceptance_rate.mean())
        rows.append({"pair": pair, "batch_size": int(b), "k": int(k), "runs": len(sub),
                     "measured": float(sub.ratio_to_adjacent_plain.median()), "measured_lo": lo, "measured_hi": hi,
                     "predicted": tokens / (int(k) * cd + cv), "alpha": pooled, "c_draft": cd, "c_verify": cv,
                     "break_even_alpha": break_even_alpha(int(k), cd, cv) if cd == cd else np.nan,
                     "spec_tokens_per_s": float(sub.tokens_per_s.median()),
                     "layout_share": float(sub.layout_share.median()), "layout_share_max": float(sub.layout_share.max()),
                     "masked_share": float(sub.masked_share.median()), "identical_share": float(sub.identical_to_plain.mean())})
    out = pd.DataFrame(rows)
    plain = runs[runs.arm == "plain"].groupby(["pair", "batch_size"]).tokens_per_s.median().rename("plain_tokens_per_s")
    return out.merge(plain.reset_index(), on=["pair", "batch_size"], how="left")


def acceptance_traces(acc: pd.DataFrame, runs: pd.DataFrame) -> dict[tuple[str, int], Trace]:
    """(prompt, k) -> the trace of that prompt's greedy draft-model run at fixed k (the acceptance
    stage's; the first job where several ran it). A prompt's length is the acceptance rows' own
    (``prompt_len``) or else that of a batch run holding it alone."""
    if acc.empty:
        return {}
    acc = acc[~acc.do_sample.astype(bool) & (acc.drafter == "model") & (acc.k_policy == "fixed")]
    alone = runs[runs.batch_size == 1].groupby("prompt_ids").context_len.first()
    out = {}
    for (prompt, k), g in acc.groupby(["prompt_id", "k"], sort=True):
        g = g[g.config_hash == g.config_hash.min()].sort_values("iteration")
        if "prompt_len" in g and g.prompt_len.notna().all():
            length = int(g.prompt_len.iloc[0])
        elif prompt in alone.index:
            length = int(alone[prompt])
        else:
            continue
        out[(prompt, int(k))] = Trace.from_counts(length, g.proposed, g.accepted, g.new_tokens)
    return out


def run_traces(runs: pd.DataFrame, traces: dict) -> list[BatchTrace | None]:
    """Per run: its rows' traces in lockstep at the run's k (a plain run: at the block's k, for the
    rows' token counts); None where a row has no trace or the traces' tokens are not the run's."""
    ks = runs[runs.arm == "speculative"].groupby(["config_hash", "block"]).k.min()
    out = []
    for r in runs.itertuples():
        k = int(r.k) if r.arm == "speculative" else int(ks.get((r.config_hash, r.block), -1))
        rows = [traces.get((p, k)) for p in r.prompt_ids.split(",")]
        ok = not r.do_sample and all(rows) and sum(t.tokens for t in rows) == r.new_tokens
        out.append(BatchTrace.lockstep(rows) if ok else None)
    return out


def _prefilled(target: BatchPassModel, draft: BatchPassModel, cal: pd.DataFrame) -> BatchTimeModel:
    """Prefills priced per padded prompt token from runs of ``cal``: the target's from the plain runs,
    the draft's from the speculative runs less the target's part."""
    plain, spec = cal[cal.arm == "plain"], cal[cal.arm == "speculative"]
    ta, tb = fit_prefill((plain.batch_size * plain.context_len).to_numpy(), plain.prefill_s.to_numpy())
    if "merged_prefill" in spec:  # a merged prefill runs inside the first iteration: no prefill apart to fit
        spec = spec[~spec.merged_prefill.fillna(False).astype(bool)]
    if spec.empty:
        return BatchTimeModel(target.with_prefill(ta, tb), draft)
    tokens = (spec.batch_size * (spec.context_len - 1)).to_numpy()
    da, db = fit_prefill(tokens, spec.prefill_s.to_numpy() - np.maximum(ta + tb * tokens, 0.0))
    return BatchTimeModel(target.with_prefill(ta, tb), draft.with_prefill(da, db))


def time_model_runs(runs: pd.DataFrame, passes: pd.DataFrame, traces: dict) -> pd.DataFrame:
    """Per speculative run: the time model's speed-up over the batched plain run of the same rows, with
    and without the loop's costs; each block predicted from its job's pass rows and its job's other blocks."""
    runs = runs.assign(trace=run_traces(runs, traces))
    rows = []
    for job, jr in runs.groupby("config_hash", sort=True):
        jp = passes[passes.config_hash == job]
        if not {"target", "draft"} <= set(jp.model):
            continue
        target, draft = (BatchPassModel.fit(*(jp[jp.model == role][c].to_numpy()
                                              for c in ("batch_size", "pass_len", "context_len", "median_s")))
                         for role in ("target", "draft"))
        for block, br in jr.groupby("block", sort=True):
            cal = jr[(jr.block != block) & jr.trace.notna()]
            b = int(br.batch_size.iloc[0])
            at_b = cal[(cal.arm == "speculative") & (cal.batch_size == b)]
            if cal.arm.nunique() < 2 or at_b.empty:
                continue
            bare = _prefilled(target, draft, cal)
            loop = calibrate_batch_loop(bare, list(at_b.trace), *(at_b[c].to_numpy() for c in (
                "iterations", "draft_s_per_iter", "verify_s_per_iter", "rollback_s_per_iter", "iter_s")))
            model = BatchTimeModel(bare.target, bare.draft, loop)
            for r in br[(br.arm == "speculative") & br.trace.notna()].itertuples():
                tokens = [traces[(p, int(r.k))].tokens for p in r.prompt_ids.split(",")]
                rows.append({"pair": r.pair, "config_hash": job, "block": int(block), "batch_size": b, "k": int(r.k),
                             "measured": r.ratio_to_adjacent_plain,
                             "predicted_time_model": model.speedup(r.trace, tokens),
                             "predicted_no_loop": bare.speedup(r.trace, tokens),
                             "iterations": int(r.iterations), "predicted_iterations": len(r.trace.proposed),
                             "target_scale": loop.target_scale, "draft_scale": loop.draft_scale,
                             "bookkeeping_ms": 1e3 * loop.bookkeeping_s})
    return pd.DataFrame(rows, columns=["pair", "config_hash", "block", "batch_size", "k", "measured",
                                       "predicted_time_model", "predicted_no_loop", "iterations",
                                       "predicted_iterations", "target_scale", "draft_scale", "bookkeeping_ms"])


def with_time_model(speed: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    """``batch_speedups`` with the time model's predictions: medians over runs, like the measurement."""
    cols = ["predicted_time_model", "predicted_no_loop", "predicted_iterations", "iterations"]
    med = per_run.groupby(["pair", "batch_size", "k"])[cols].median().reset_index()
    return speed.merge(med, on=["pair", "batch_size", "k"], how="left")


def model_error(speed: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    """Per pair and B: mean and max absolute error over k of each prediction against the measured speed-up,
    and the time model's calibration at that B (medians over the blocks it predicted)."""
    rows = []
    cal = per_run.groupby(["pair", "batch_size"])[["target_scale", "draft_scale", "bookkeeping_ms"]].median()
    for (pair, b), g in speed.groupby(["pair", "batch_size"], sort=True):
        row = {"pair": pair, "batch_size": int(b), "points": len(g)}
        for col, name in PREDICTORS.items():
            err = (g[col] - g.measured).abs()
            row.update({f"{name}_mae": float(err.mean()), f"{name}_max": float(err.max()),
                        f"{name}_signed": float((g[col] - g.measured).mean())})
        row["error_ratio"] = row["time_model_mae"] / row["formula_mae"]
        row.update({c: float(cal[c].get((pair, b), np.nan)) for c in cal.columns})
        rows.append(row)
    return pd.DataFrame(rows)


def pass_time_figure(costs: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    sns.lineplot(data=costs, x="pass_len", y="target_pass_ms", hue="batch_size", marker="o", palette="viridis",
                 ax=axes[0])
    axes[0].set(xlabel="new tokens per row in the pass (n)", ylabel="target pass time (ms)",
                title="Target pass over B rows x n new tokens")
    sns.lineplot(data=costs, x="pass_len", y="c_verify", hue="batch_size", marker="o", palette="viridis", ax=axes[1])
    axes[1].axhline(1.0, color="grey", lw=1, ls="--")
    axes[1].set(xlabel="new tokens per row in the pass (n)", ylabel="pass time / one-token step at the same B",
                title="c_verify(B, k = n - 1): flat means a check costs a step")
    for ax in axes:
        ax.legend(title="batch size B", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def speedup_figure(speed: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, sub in speed.groupby("k"):
        sub = sub.sort_values("batch_size")
        line = ax.errorbar(sub.batch_size, sub.measured, yerr=[sub.measured - sub.measured_lo, sub.measured_hi - sub.measured],
                           marker="o", capsize=3, label=f"k = {k} measured (median, 95% CI)")
        color = line[0].get_color()
        ax.plot(sub.batch_size, sub.predicted, ls="--", marker="x", color=color, label=f"k = {k} formula at B")
        ax.plot(sub.batch_size, sub.predicted_time_model, ls=":", marker="^", color=color,
                label=f"k = {k} time model at B")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(speed.batch_size.unique()), [str(b) for b in sorted(speed.batch_size.unique())])
    ax.set(xlabel="batch size B (rows decoded together)", ylabel="speed-up over batched plain (tokens/s over rows)",
           title="Speculation as the batch grows")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def error_metrics(errors: pd.DataFrame, campaign: str) -> dict:
    """Per pair and B: the mean absolute error of the formula and of the time model (``dvc metrics``)."""
    out = {"campaign": campaign}
    for pair, g in errors.groupby("pair", sort=True):
        value = (lambda v: round(float(v), 6) if v == v else None)  # no prediction: null
        out[pair] = {f"mae_{name}": {f"B{int(r.batch_size)}": value(getattr(r, f"{name}_mae")) for r in g.itertuples()}
                     for name in ("formula", "time_model")}
    return out


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    campaign = published_campaign(params)
    batch = read_stage(params["outputs_dir"], "batch", campaign)
    if batch.empty:
        raise AnalysisError(f"no batch results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=batch campaign={campaign}`")
    runs, passes = batch[batch.measure == "run"], batch[batch.measure == "pass"]
    costs = batch_costs(passes)
    traces = acceptance_traces(read_stage(params["outputs_dir"], "acceptance", campaign), runs)
    per_run = time_model_runs(runs, passes, traces)
    if per_run.empty:
        print(f"analysis.batch: no time-model prediction: campaign {campaign!r} needs greedy acceptance runs "
              "(stage=acceptance) of the batch's prompts at its k, and two blocks per job and B")
    speed = with_time_model(batch_speedups(runs, costs, params["bootstrap"]), per_run)
    errors = model_error(speed, per_run)
    figures = {"batch_pass_time.png": pass_time_figure(costs), "batch_speedup.png": speedup_figure(speed)}
    save_table(costs, out / "batch_costs.parquet")
    save_table(speed, out / "batch_speedups.parquet")
    save_table(errors, out / "batch_model_error.parquet")
    save_json(error_metrics(errors, campaign), Path(params["metrics_dir"]) / "detail" / "batch.json")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    print(errors[["pair", "batch_size", "points", "formula_mae", "formula_max", "time_model_mae", "time_model_max",
                  "no_loop_mae", "error_ratio"]].to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.batch", main)
