"""Correctness summaries: greedy divergences (gap in ulps, near-tie or bug) and distribution tests.

    python -m analysis.correctness   (reads the published campaign's divergence and distribution results)
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.common import load_params, published_campaign, read_stage, run_script, save_figure, save_table

DIVERGENCE_COLUMNS = ["pair", "prompt_id", "kind", "k", "round", "position", "plain_text", "spec_text",
                      "gap_single_step", "gap_verify_pass", "gap_full_prefill", "top_logit", "ulp", "gap_ulps",
                      "classification"]


def divergence_summary(div: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts per pair and k, and the table of divergences."""
    counts = div.groupby(["pair", "k"]).agg(
        runs=("identical", "size"), identical=("identical", "sum"),
        near_ties=("classification", lambda s: int((s == "near_tie").sum())),
        bugs=("classification", lambda s: int((s == "bug").sum()))).reset_index()
    table = div[~div.identical.astype(bool)][DIVERGENCE_COLUMNS].sort_values(["pair", "prompt_id", "k"])
    return counts, table.reset_index(drop=True)


def distribution_summary(dist: pd.DataFrame, level: float = 0.01) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rejection rate per rule among contexts with power, and the per-test table."""
    if "power" not in dist:
        dist = dist.assign(power=float("nan"))
    table = dist[["pair", "prompt_id", "kind", "context_mode", "seed", "rule", "temperature", "top_p", "draws",
                  "pvalue", "power", "total_variation", "expected_acceptance", "no_power"]].copy()
    table["verdict"] = [("no power" if npow else ("rejected" if p < level else "passed"))
                        for p, npow in zip(table.pvalue, table.no_power)]
    powered = table[~table.no_power]
    rates = powered.groupby(["pair", "context_mode", "temperature", "top_p", "rule"]).agg(
        tests=("pvalue", "size"), rejected=("pvalue", lambda p: int((p < level).sum())),
        min_pvalue=("pvalue", "min"), mean_power=("power", "mean"), draws=("draws", "median")).reset_index()
    rates["rejection_rate"] = rates.rejected / rates.tests
    keys = ["pair", "context_mode", "temperature", "top_p", "rule"]
    no_power = table[table.no_power].groupby(keys).size().rename("no_power_tests").reset_index()
    rates = rates.merge(no_power, on=keys, how="left").fillna({"no_power_tests": 0})
    return rates, table


def rates_figure(rates: pd.DataFrame):
    import seaborn as sns
    from matplotlib import pyplot as plt

    r = rates.assign(setting=rates.context_mode + ", T=" + rates.temperature.map("{:g}".format))
    order, hues = sorted(r.rule.unique()), sorted(r.setting.unique())
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    sns.barplot(data=r, x="rule", y="rejection_rate", hue="setting", order=order, hue_order=hues, ax=axes[0],
                errorbar=None)
    sns.barplot(data=r, x="rule", y="mean_power", hue="setting", order=order, hue_order=hues, ax=axes[1],
                errorbar=None, legend=False)
    axes[0].set(ylim=(0, 1.05), ylabel="share of tests", xlabel="acceptance rule", title="rejected at p < 0.01")
    axes[1].set(xlabel="acceptance rule", title="power against the wrong rules (simulated)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20, labelsize=7)
    # The legend goes beside the panels, never over a bar.
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].get_legend().remove()
    fig.legend(handles, labels, title="contexts, temperature", loc="upper left", bbox_to_anchor=(1.0, 0.88),
               frameon=False, fontsize=8)
    fig.suptitle("Distribution tests per rule (contexts with power only)")
    fig.tight_layout()
    return fig


def main() -> None:
    params = load_params()
    out = Path(params["analysis_dir"])
    campaign = published_campaign(params)
    div = read_stage(params["outputs_dir"], "divergence", campaign)
    dist = read_stage(params["outputs_dir"], "distribution", campaign)
    tables, figures, lines = {}, {}, []
    if not div.empty:
        counts, table = divergence_summary(div)
        tables.update({"divergence_counts": counts, "divergences": table})
        lines.append(counts.to_string(index=False))
    if not dist.empty:
        rates, table = distribution_summary(dist)
        tables.update({"distribution_rates": rates, "distribution_tests": table})
        figures["distribution_rejections.png"] = rates_figure(rates)
        lines.append(rates.to_string(index=False))
    # Everything is computed; only now are outputs replaced (each atomically).
    for name, df in tables.items():
        save_table(df, out / f"{name}.parquet")
    for name, fig in figures.items():
        save_figure(fig, Path(params["figures_dir"]) / name)
    print("\n".join(lines))


if __name__ == "__main__":
    run_script("analysis.correctness", main)
