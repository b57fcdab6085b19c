"""Beyond one fixed draft: speed-up per drafter and k policy per kind, adaptive vs best fixed k,
and sampled vs greedy acceptance.

    python -m analysis.strategies   (reads the published campaign's speed and acceptance results)
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import load_params, published_campaign, read_stage, run_script, save_figure, save_table
from analysis.drift import drift_table, drop_drifted
from analysis.fit import alpha_hat
from analysis.inputs import AnalysisError


def sampling_label(df: pd.DataFrame) -> pd.Series:
    return df.apply(lambda r: "greedy" if not r.do_sample else
                    f"T={r.temperature:g}" + ("" if r.get("top_p", 1.0) >= 1.0 else f", top-p {r.top_p:g}"), axis=1)


def strategy_table(speed: pd.DataFrame) -> pd.DataFrame:
    """Median adjacent-run speed-up per pair, sampling, drafter, k policy, k and kind."""
    spec = speed[speed.arm != "plain"].assign(sampling=lambda d: sampling_label(d))
    return (spec.groupby(["pair", "sampling", "drafter", "k_policy", "arm", "k", "kind"])
            .agg(runs=("ratio_to_adjacent_plain", "size"), speedup=("ratio_to_adjacent_plain", "median"),
                 alpha=("acceptance_rate", "mean"), mean_k=("mean_k", "mean"))
            .reset_index())


def adaptive_vs_fixed(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair, sampling, drafter and kind: the best fixed k against each adaptive policy."""
    rows = []
    spec = table[table.arm == "speculative"]
    for (pair, sampling, drafter, kind), g in spec.groupby(["pair", "sampling", "drafter", "kind"]):
        fixed = g[g.k_policy == "fixed"]
        if fixed.empty:
            continue
        best = fixed.loc[fixed.speedup.idxmax()]
        for r in g[g.k_policy != "fixed"].itertuples():
            rows.append({"pair": pair, "sampling": sampling, "drafter": drafter, "kind": kind,
                         "best_fixed_k": int(best.k), "best_fixed_speedup": best.speedup, "policy": r.k_policy,
                         "policy_speedup": r.speedup, "policy_mean_k": r.mean_k,
                         "policy_vs_best_fixed": r.speedup / best.speedup})
    return pd.DataFrame(rows)


def drafter_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair, sampling and kind: each drafter's best fixed-k speed-up."""
    fixed = table[(table.arm == "speculative") & (table.k_policy == "fixed")]
    idx = fixed.groupby(["pair", "sampling", "drafter", "kind"]).speedup.idxmax()
    return fixed.loc[idx, ["pair", "sampling", "drafter", "kind", "k", "speedup", "alpha"]].reset_index(drop=True)


def sampled_alpha(acc: pd.DataFrame) -> pd.DataFrame:
    """alpha per pair, sampling, kind and k; with how much lower each sampled alpha is than greedy's."""
    acc = acc[(acc.drafter == "model") & (acc.k_policy == "fixed")].assign(sampling=lambda d: sampling_label(d))
    rows = [{"pair": pair, "sampling": s, "kind": kind, "k": int(k), "iterations": len(g), "alpha": alpha_hat(g)}
            for (pair, s, kind, k), g in acc.groupby(["pair", "sampling", "kind", "k"])]
    rows += [{"pair": pair, "sampling": s, "kind": "all", "k": int(k), "iterations": len(g), "alpha": alpha_hat(g)}
             for (pair, s, k), g in acc.groupby(["pair", "sampling", "k"])]
    tab = pd.DataFrame(rows)
    greedy = tab[tab.sampling == "greedy"].set_index(["pair", "kind", "k"]).alpha
    tab["greedy_alpha"] = [greedy.get((r.pair, r.kind, r.k), float("nan")) for r in tab.itertuples()]
    tab["alpha_minus_greedy"] = tab.alpha - tab.greedy_alpha
    return tab


def strategy_figure(table: pd.DataFrame):
    t = table[table.arm == "speculative"].copy()
    t["strategy"] = t.apply(lambda r: f"{r.drafter}, " + (f"k={r.k}" if r.k_policy == "fixed" else r.k_policy), axis=1)
    t = t[t.sampling == "greedy"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    sns.barplot(data=t, x="strategy", y="speedup", hue="kind", ax=ax, errorbar=None)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set(title="Speed-up per drafter and k policy (greedy; median over adjacent-run ratios)", xlabel="",
           ylabel="speed-up over adjacent plain run")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    return fig


def sampled_alpha_figure(tab: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.barplot(data=tab[tab.kind != "all"], x="kind", y="alpha", hue="sampling", ax=ax, errorbar=None)
    ax.set(ylim=(0, 1), title="Acceptance rate: greedy vs sampled (all k pooled per row)", ylabel="alpha-hat")
    return fig


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    campaign = published_campaign(params)
    speed = read_stage(params["outputs_dir"], "speed", campaign)
    acc = read_stage(params["outputs_dir"], "acceptance", campaign)
    if speed.empty or acc.empty:
        raise AnalysisError(f"needs speed and acceptance results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=all campaign={campaign}`")
    if params["drift"]["exclude"]:
        speed = drop_drifted(speed, drift_table(speed, float(params["drift"]["max_ratio"])))
    table = strategy_table(speed)
    adaptive, drafters, sampled = adaptive_vs_fixed(table), drafter_comparison(table), sampled_alpha(acc)
    figures = {"strategies.png": strategy_figure(table), "sampled_alpha.png": sampled_alpha_figure(sampled)}
    # Everything is computed; only now are outputs replaced (each atomically).
    save_table(table, out / "strategy_speedups.parquet")
    save_table(adaptive, out / "adaptive_vs_fixed.parquet")
    save_table(drafters, out / "drafter_comparison.parquet")
    save_table(sampled, out / "sampled_alpha.parquet")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    print(drafters.to_string(index=False))
    print(adaptive.to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.strategies", main)
