"""Beyond one fixed draft: speed-up per drafter and k policy per kind, adaptive vs best fixed k,
and sampled vs greedy acceptance.

    python -m analysis.strategies   (reads the published campaign's speed and acceptance results)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, published_campaign, read_stage,
                             run_script, save_figure, save_table)
from analysis.drift import drop_drifted, read_drift
from analysis.fit import alpha_hat
from analysis.inputs import AnalysisError

# The strategies compared in strategies.png, in legend order, with their colours.
STRATEGIES = {"draft model, best fixed k": "#1f77b4", "draft model, adaptive k (cost model)": "#2ca02c",
              "draft model, adaptive k (heuristic)": "#ff7f0e", "prompt lookup, best fixed k": "#9467bd"}
POLICY_NAMES = {"cost_model": "cost model", "heuristic": "heuristic"}


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


def strategy_comparison(speed: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Greedy, per pair and kind: the draft model's best fixed k, each adaptive k policy (draft model) and
    prompt lookup's best fixed k, as the median adjacent-run speed-up with its distribution-free interval.

    "Best fixed k" is the fixed k with the highest median (as in adaptive_vs_fixed); choosing the best
    of several makes its median optimistic, so an adaptive policy within its interval is as good.
    """
    spec = speed[(speed.arm == "speculative") & ~speed.do_sample.astype(bool)]
    rows = []

    def add(pair: str, kind: str, strategy: str, runs: pd.DataFrame, k: int | None) -> None:
        lo, hi = bootstrap_ci(runs.ratio_to_adjacent_plain.to_numpy(), np.median, **boot)
        rows.append({"pair": pair, "kind": kind, "strategy": strategy, "drafter": runs.drafter.iloc[0],
                     "k_policy": runs.k_policy.iloc[0], "k": k, "mean_k": float(runs.mean_k.mean()), "runs": len(runs),
                     "speedup": float(runs.ratio_to_adjacent_plain.median()), "speedup_lo": lo, "speedup_hi": hi})

    for (pair, kind), g in spec.groupby(["pair", "kind"], sort=True):
        for drafter, name in (("model", "draft model"), ("prompt_lookup", "prompt lookup")):
            fixed = g[(g.drafter == drafter) & (g.k_policy == "fixed")]
            if len(fixed):
                k = int(fixed.groupby("k").ratio_to_adjacent_plain.median().idxmax())
                add(pair, kind, f"{name}, best fixed k", fixed[fixed.k == k], k)
            if drafter == "model":
                for policy, label in POLICY_NAMES.items():
                    runs = g[(g.drafter == drafter) & (g.k_policy == policy)]
                    if len(runs):
                        add(pair, kind, f"draft model, adaptive k ({label})", runs, None)
    table = pd.DataFrame(rows, columns=["pair", "kind", "strategy", "drafter", "k_policy", "k", "mean_k", "runs",
                                        "speedup", "speedup_lo", "speedup_hi"])
    return table.astype({"k": "Int64"})


def strategy_figure(comparison: pd.DataFrame):
    """Adaptive vs best fixed k: one panel per kind (best first), strategies sorted by speed-up, 95% intervals."""
    if comparison.empty:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.text(0.5, 0.5, "no greedy speed results", ha="center", va="center")
        ax.set_axis_off()
        return fig
    several_pairs = comparison.pair.nunique() > 1
    top = comparison.groupby(["pair", "kind"]).speedup.max().sort_values(ascending=False, kind="mergesort")
    panels = list(top.index)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 0.38 * len(comparison) + 0.9 * len(panels) + 0.6),
                             sharex=True, squeeze=False)
    for ax, (pair, kind) in zip(axes[:, 0], panels):
        g = comparison[(comparison.pair == pair) & (comparison.kind == kind)].sort_values("speedup", kind="mergesort")
        y = np.arange(len(g))
        for yi, r in zip(y, g.itertuples()):
            lo, hi = (r.speedup_lo, r.speedup_hi) if r.speedup_lo == r.speedup_lo else (r.speedup, r.speedup)  # too few runs: a point
            ax.errorbar(r.speedup, yi, xerr=[[r.speedup - lo], [hi - r.speedup]], fmt="o",
                        color=STRATEGIES.get(r.strategy, "grey"), capsize=3, ms=7, label=r.strategy)
            ax.annotate(f"x{r.speedup:.2f}", (hi, yi), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7)
        labels = [f"{r.strategy.split(', ')[0]}, " + (f"fixed k={r.k}" if r.k_policy == "fixed" else
                                                     f"{POLICY_NAMES.get(r.k_policy, r.k_policy)} (mean k {r.mean_k:.1f})")
                  + f", {r.runs} runs" for r in g.itertuples()]
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(-0.6, len(g) - 0.4)
        ax.axvline(1.0, color="grey", lw=1, ls="--")
        ax.set_title(f"{pair}: {kind}" if several_pairs else kind, fontsize=10, loc="left")
    lows, highs = comparison.speedup_lo.fillna(comparison.speedup), comparison.speedup_hi.fillna(comparison.speedup)
    axes[-1, 0].set_xlim(min(0.95, float(lows.min()) - 0.05), float(highs.max()) * 1.08)  # room for the labels
    axes[-1, 0].set_xlabel("speed-up over the adjacent plain run (median of run ratios, 95% distribution-free interval; "
                           "dashed: 1.0 = no gain)", fontsize=8)
    fig.supylabel("strategy (fastest on top)", fontsize=9)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=name) for name, c in STRATEGIES.items()
               if name in set(comparison.strategy)]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, frameon=False,
               title="strategy")
    fig.suptitle("Adaptive k vs the best fixed k, per prompt kind (greedy)", x=0.5)
    fig.tight_layout()
    return fig


def sampled_alpha_figure(tab: pd.DataFrame):
    """alpha per kind and sampling setting, averaged over the k measured in every setting (like with like)."""
    t = tab[tab.kind != "all"]
    settings = sorted(t.sampling.unique(), key=lambda v: (v != "greedy", v))
    common = sorted(set.intersection(*(set(g.k) for _, g in t.groupby("sampling")))) if len(t) else []
    t = t[t.k.isin(common)]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.barplot(data=t, x="kind", y="alpha", hue="sampling", hue_order=settings, ax=ax, errorbar=None)
    ax.set(ylim=(0, 1), ylabel="alpha-hat (accepted / checked proposals)", xlabel="prompt kind",
           title=f"Acceptance rate: greedy vs sampled (mean over k = {', '.join(map(str, common))})")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), frameon=False, title="sampling")
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
    boot = bootstrap_settings(params)
    if params["drift"]["exclude"]:
        speed = drop_drifted(speed, read_drift(params, speed))
    table = strategy_table(speed)
    adaptive, drafters, sampled = adaptive_vs_fixed(table), drafter_comparison(table), sampled_alpha(acc)
    comparison = strategy_comparison(speed, boot)
    figures = {"strategies.png": strategy_figure(comparison), "sampled_alpha.png": sampled_alpha_figure(sampled)}
    # Everything is computed; only now are outputs replaced (each atomically).
    save_table(table, out / "strategy_speedups.parquet")
    save_table(adaptive, out / "adaptive_vs_fixed.parquet")
    save_table(drafters, out / "drafter_comparison.parquet")
    save_table(sampled, out / "sampled_alpha.parquet")
    save_table(comparison, out / "strategy_comparison.parquet")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    print(drafters.to_string(index=False))
    print(adaptive.to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.strategies", main)
