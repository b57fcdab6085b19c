"""Batches: where the flatness of the target's pass ends, and where speculation stops paying.

    python -m analysis.batch   (reads the published campaign's batch results; writes
                                outputs/analysis/batch_costs.parquet, batch_speedups.parquet and two figures)

The cost model extended to a batch of B rows: costs are in units of one batched target step
T(B, 1) (B rows, one new token each), so c_draft(B) = D(B, 1) / T(B, 1) and
c_verify(B, k) = T(B, k + 1) / T(B, 1). One iteration yields, per row, (1 - a^(k+1)) / (1 - a)
tokens for that row's acceptance rate a; the prediction averages that over the rows (acceptance
differs between prompts) and divides by k c_draft(B) + c_verify(B, k).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (
    AnalysisError, bootstrap_ci, load_params, published_campaign, read_stage, run_script, save_figure, save_table,
)
from speclab.cost_model import break_even_alpha, expected_tokens_per_iteration


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
        ax.plot(sub.batch_size, sub.predicted, ls="--", marker="x", color=line[0].get_color(),
                label=f"k = {k} predicted (cost model at B)")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(speed.batch_size.unique()), [str(b) for b in sorted(speed.batch_size.unique())])
    ax.set(xlabel="batch size B (rows decoded together)", ylabel="speed-up over batched plain (tokens/s over rows)",
           title="Speculation as the batch grows")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    campaign = published_campaign(params)
    batch = read_stage(params["outputs_dir"], "batch", campaign)
    if batch.empty:
        raise AnalysisError(f"no batch results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=batch campaign={campaign}`")
    costs = batch_costs(batch[batch.measure == "pass"])
    speed = batch_speedups(batch[batch.measure == "run"], costs, params["bootstrap"])
    figures = {"batch_pass_time.png": pass_time_figure(costs), "batch_speedup.png": speedup_figure(speed)}
    save_table(costs, out / "batch_costs.parquet")
    save_table(speed, out / "batch_speedups.parquet")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    print(speed[["pair", "batch_size", "k", "measured", "predicted", "alpha", "layout_share"]].to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.batch", main)
