"""Where speculation pays: step time vs pass length, break-even alpha per k, the speed-up map, best k.

    python -m analysis.breakeven   (reads the published campaign's timing results and the fit's speed points)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (load_params, published_campaign, read_stage, read_table, run_script, save_csv,
                             save_figure, save_table)
from analysis.inputs import AnalysisError
from analysis.palette import MODEL_COLORS, kind_color
from speclab.costs.cost_model import break_even_alpha, predicted_speedup


def cost_ratios(timing: pd.DataFrame) -> pd.DataFrame:
    """Per pair: c_draft and c_verify(n) = target pass over n new tokens / target step (medians over runs)."""
    med = timing.groupby(["pair", "model", "pass_len"]).median_s.median().reset_index()
    rows = []
    for pair, g in med.groupby("pair"):
        t = g[g.model == "target"].set_index("pass_len").median_s
        d = g[g.model == "draft"].set_index("pass_len").median_s
        for n, v in t.items():
            rows.append({"pair": pair, "pass_len": int(n), "target_s": v, "c_verify": v / t[1],
                         "c_draft": d[1] / t[1], "draft_s": d[1]})
    return pd.DataFrame(rows)


def c_verify_for(costs: pd.DataFrame, k: int) -> float:
    """Verification covers k+1 new tokens: the shortest measured pass at least that long, else the longest."""
    longer = costs.pass_len[costs.pass_len >= k + 1]
    n = int(longer.min()) if len(longer) else int(costs.pass_len.max())
    return float(costs.loc[costs.pass_len == n, "c_verify"].iloc[0])


def breakeven_table(costs: pd.DataFrame, k_max: int) -> pd.DataFrame:
    rows = []
    for pair, c in costs.groupby("pair"):
        cd = float(c.c_draft.iloc[0])
        for k in range(1, k_max + 1):
            cv = c_verify_for(c, k)
            rows.append({"pair": pair, "k": k, "c_draft": cd, "c_verify": cv,
                         "break_even_alpha": break_even_alpha(k, cd, cv)})
    return pd.DataFrame(rows)


def best_k_table(points: pd.DataFrame, costs: pd.DataFrame, k_max: int) -> pd.DataFrame:
    """Best k per kind: by the cost model (alpha of the kind, measured costs) and by measurement."""
    rows = []
    for (pair, kind), g in points.groupby(["pair", "kind"]):
        c = costs[costs.pair == pair]
        if c.empty or g.alpha.isna().all():
            continue
        a = float(np.average(g.alpha.dropna()))
        cd = float(c.c_draft.iloc[0])
        preds = {k: predicted_speedup(a, k, cd, c_verify_for(c, k)) for k in range(1, k_max + 1)}
        k_pred = max(preds, key=preds.get)
        best = g.loc[g.measured.idxmax()]
        rows.append({"pair": pair, "kind": kind, "alpha": a, "best_k_predicted": k_pred,
                     "predicted_speedup": preds[k_pred], "best_k_measured": int(best.k),
                     "measured_speedup": float(best.measured)})
    return pd.DataFrame(rows)


def step_time_figure(timing: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    d = timing.assign(ms=1e3 * timing.median_s)
    sns.lineplot(data=d, x="pass_len", y="ms", hue="model", style="pair", marker="o", ax=ax, palette=MODEL_COLORS,
                 estimator="median", errorbar=None)
    ax.set(xlabel="new tokens in the pass", ylabel="pass time (ms, median)", ylim=(0, None),
           title="Step time vs pass length (after the prompt)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    return fig


def step_time_data(timing: pd.DataFrame) -> pd.DataFrame:
    """Plot data for `dvc plots`: median pass time (ms) per pair, model and pass length (the figure's lines)."""
    med = timing.groupby(["pair", "model", "pass_len"], sort=True).median_s.median().reset_index()
    one_pair = med.pair.nunique() <= 1
    return pd.DataFrame({"series": med.model if one_pair else med.pair + ": " + med.model, "pair": med.pair,
                         "model": med.model, "pass_len": med.pass_len.astype(int), "ms": 1e3 * med.median_s})


def map_figure(costs: pd.DataFrame, points: pd.DataFrame, pairs: list[str], alpha_steps: int, k_max: int):
    """One panel per pair: predicted speed-up over (alpha, k), the break-even line, each kind's measured best k."""
    fig, axes = plt.subplots(1, len(pairs), figsize=(7 * len(pairs), 4.8), squeeze=False)
    alphas = np.linspace(0, 1, alpha_steps)
    ks = np.arange(1, k_max + 1)
    for ax, pair in zip(axes[0], pairs):
        c = costs[costs.pair == pair]
        cd = float(c.c_draft.iloc[0])
        grid = np.array([[predicted_speedup(a, int(k), cd, c_verify_for(c, int(k))) for a in alphas] for k in ks])
        mesh = ax.pcolormesh(alphas, ks, grid, cmap="RdBu", vmin=0, vmax=2, shading="nearest")
        be = [break_even_alpha(int(k), cd, c_verify_for(c, int(k))) for k in ks]
        ax.plot(be, ks, "k-", lw=2, label="break-even alpha (speed-up = 1)")
        pts = points[(points.pair == pair) & (points.kind != "all")]
        for kind, g in pts.groupby("kind"):
            best = g.loc[g.measured.idxmax()]
            ax.plot(best.alpha, best.k, "o", ms=9, mec="k", color=kind_color(kind),
                    label=f"{kind}: measured x{best.measured:.2f} at best k")
        ax.set(xlabel="acceptance rate alpha", ylabel="k (proposals per iteration)")
        ax.set_title(f"Predicted speed-up map, {pair} (blue wins, red loses)\n"
                     f"c_draft = draft step / target step = {cd:.2f}\n"
                     "c_verify(k) = target pass over k+1 tokens / target step (measured)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16), ncol=2, frameon=False)
        fig.colorbar(mesh, ax=ax, label="predicted speed-up over plain decoding")
    return fig


def after_prompt(timing: pd.DataFrame) -> pd.DataFrame:
    """Passes right after each prompt only: prefills (context 0) and the longer contexts are the time model's."""
    passes = timing[timing.context_len > 0]
    return passes[passes.context_len == passes.groupby(["pair", "prompt_id"]).context_len.transform("min")]


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    campaign = published_campaign(params)
    timing = read_stage(params["outputs_dir"], "timing", campaign)
    if not timing.empty:
        timing = after_prompt(timing)
    if timing.empty:
        raise AnalysisError(f"no timing results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=timing campaign={campaign}`")
    points = read_table(out, "speed_points")
    if points.empty:
        raise AnalysisError(f"{out / 'speed_points.parquet'} is missing or empty; run `python -m analysis.fit` first")
    k_max, steps = int(params["map"]["k_max"]), int(params["map"]["alpha_steps"])
    costs = cost_ratios(timing)
    table = breakeven_table(costs, k_max)
    best = best_k_table(points, costs, k_max)
    pairs = sorted(set(costs.pair) & set(points.pair))
    if not pairs:
        raise AnalysisError(f"no pair has both timing results and speed points in campaign {campaign!r}")
    figures = {"step_time_vs_pass_length.png": step_time_figure(timing),
               "speedup_map.png": map_figure(costs, points, pairs, steps, k_max)}
    step_times = step_time_data(timing)
    # Everything is computed; only now are outputs replaced (each atomically).
    save_table(costs, out / "cost_ratios.parquet")
    save_table(table, out / "breakeven.parquet")
    save_table(best, out / "best_k.parquet")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    save_csv(step_times, Path(params["metrics_dir"]) / "plots" / "step_time.csv")
    print(best.to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.breakeven", main)
