"""Prediction vs measurement: tokens per target pass and speed-up, from the i.i.d. geometric model
and from a better predictor (empirical acceptance plus a per-iteration overhead).

    python -m analysis.fit        (reads the published campaign's acceptance and speed results)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, published_campaign, read_stage,
                             run_script, save_csv, save_figure, save_table, speedup_panels)
from analysis.drift import drop_drifted, read_drift
from analysis.inputs import AnalysisError
from analysis.palette import PREDICTOR_COLORS, kind_palette
from speclab.costs.cost_model import expected_tokens_per_iteration
from speclab.stats.estimators import alpha_hat as acceptance_rate

ALL = "all"


def alpha_hat(df: pd.DataFrame) -> float:
    return acceptance_rate(df.accepted, df.proposed)


def with_pooled_kind(df: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([df, df.assign(kind=ALL)], ignore_index=True)


def formula_acceptance(acc: pd.DataFrame) -> pd.DataFrame:
    """The acceptance rows the cost model is about: a draft model at a fixed k, greedy (other strategies:
    analysis.strategies)."""
    return acc[~acc.do_sample & (acc.drafter == "model") & (acc.k_policy == "fixed")]


def formula_speed(speed: pd.DataFrame) -> pd.DataFrame:
    """The speed rows of the same: the draft model at a fixed k, greedy, and the plain runs beside them."""
    return speed[~speed.do_sample & speed.drafter.isin(["model", "none"]) & speed.k_policy.isin(["fixed", "none"])]


def acceptance_table(acc: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair, kind (and pooled) and k: alpha-hat, tokens per pass measured vs formula vs per-prompt mixture."""
    rows = []
    for (pair, kind, k), g in with_pooled_kind(acc).groupby(["pair", "kind", "k"], sort=True):
        a = alpha_hat(g)
        prompt_alphas = g.groupby("prompt_id").apply(alpha_hat, include_groups=False).dropna()
        lo, hi = bootstrap_ci(g.new_tokens.to_numpy(), np.mean, **boot)
        rows.append({"pair": pair, "kind": kind, "k": int(k), "iterations": len(g), "alpha": a,
                     "proposal_efficiency": g.accepted.sum() / g.proposed.sum(),
                     "tokens_per_pass": g.new_tokens.mean(), "tokens_per_pass_lo": lo, "tokens_per_pass_hi": hi,
                     "formula_iid": float(expected_tokens_per_iteration(a, k)),
                     "formula_prompt_mixture": float(np.mean(expected_tokens_per_iteration(prompt_alphas.to_numpy(), k)))})
    return pd.DataFrame(rows)


def _alpha_lookup(alpha_tab: pd.DataFrame, pair: str, kind: str, k: int) -> tuple[float, float, str]:
    """(alpha, empirical tokens per pass, source) for a point; pooled over k when k was not measured."""
    sub = alpha_tab[(alpha_tab.pair == pair) & (alpha_tab.kind == kind)]
    exact = sub[sub.k == k]
    if len(exact):
        r = exact.iloc[0]
        return r.alpha, r.tokens_per_pass, f"acceptance k={k}"
    if len(sub):
        # alpha is a property of text and pair, not of k: pool the measured k, weighting by checks.
        a = float(np.average(sub.alpha, weights=sub.iterations))
        mix = float(expected_tokens_per_iteration(a, k))
        return a, mix, "acceptance pooled over k"
    return float("nan"), float("nan"), "none"


def speed_points(speed: pd.DataFrame, alpha_tab: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per pair, kind and k: measured adjacent-run speed-up (median, CI) and both predictors."""
    spec = with_pooled_kind(speed[speed.arm == "speculative"])
    rows = []
    for (pair, kind, k), g in spec.groupby(["pair", "kind", "k"], sort=True):
        target = (g.target_step_before_s + g.target_step_after_s) / 2
        c_draft = float(((g.draft_step_before_s + g.draft_step_after_s) / 2 / target).mean())
        c_verify = float(((g.verify_before_s + g.verify_after_s) / 2 / target).mean())
        overhead = float(((g.rollback_s_per_iter + g.bookkeeping_s_per_iter) / target).mean())
        a, e_emp, source = _alpha_lookup(alpha_tab, pair, kind, int(k))
        cost = k * c_draft + c_verify
        lo, hi = bootstrap_ci(g.ratio_to_adjacent_plain.to_numpy(), np.median, **boot)
        rows.append({"pair": pair, "kind": kind, "k": int(k), "runs": len(g),
                     "measured": g.ratio_to_adjacent_plain.median(), "measured_lo": lo, "measured_hi": hi,
                     "alpha": a, "alpha_source": source, "alpha_in_speed_runs": g.acceptance_rate.mean(),
                     "c_draft": c_draft, "c_verify": c_verify, "overhead": overhead,
                     "predicted_iid": float(expected_tokens_per_iteration(a, k)) / cost if a == a else np.nan,
                     "predicted_empirical": e_emp / (cost + overhead)})
    return pd.DataFrame(rows)


def predictor_errors(points: pd.DataFrame) -> pd.DataFrame:
    """Mean absolute error of each predictor against the measured speed-up, per pair and kind."""
    if points.empty:
        return pd.DataFrame(columns=["pair", "kind", "points", "mae_iid", "mae_empirical_overhead"])
    rows = []
    for (pair, kind), g in points.groupby(["pair", "kind"], sort=True):
        rows.append({"pair": pair, "kind": kind, "points": len(g),
                     "mae_iid": (g.predicted_iid - g.measured).abs().mean(),
                     "mae_empirical_overhead": (g.predicted_empirical - g.measured).abs().mean()})
    return pd.DataFrame(rows)


def series(df: pd.DataFrame) -> pd.Series:
    """The line a row belongs to in `dvc plots`: its kind, prefixed by the pair when there are several."""
    return df.kind if df.pair.nunique() <= 1 else df.pair + ": " + df.kind


def plot_data(tab: pd.DataFrame, points: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Small CSVs for `dvc plots` (declared in dvc.yaml's top-level plots)."""
    speed = points[["pair", "kind", "k", "runs", "measured", "measured_lo", "measured_hi", "predicted_iid",
                    "predicted_empirical", "alpha"]]
    predictions = pd.concat([
        speed[["pair", "kind", "k", "measured"]].assign(predictor=name, predicted=speed[col])
        for name, col in (("i.i.d. geometric", "predicted_iid"), ("empirical + overhead", "predicted_empirical"))],
        ignore_index=True)
    alpha = tab[["pair", "kind", "k", "iterations", "alpha", "tokens_per_pass", "formula_iid"]]
    return {name: df.assign(series=series(df))[["series", *df.columns]]
            for name, df in (("speed_points.csv", speed), ("speed_predictions.csv", predictions),
                             ("alpha_by_k.csv", alpha))}


def alpha_figure(tab: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=tab, x="k", y="alpha", hue="kind", style="pair", marker="o", ax=ax, errorbar=None,
                 palette=kind_palette(tab.kind.unique()))
    ax.set(ylim=(0, 1), title="Acceptance rate per kind vs k (accepted / checked proposals)", ylabel="alpha-hat")
    return fig


def tokens_figure(tab: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    t = tab[tab.kind != ALL]
    palette = kind_palette(t.kind.unique())
    sns.lineplot(data=t, x="k", y="tokens_per_pass", hue="kind", marker="o", ax=ax, errorbar=None, palette=palette)
    sns.lineplot(data=t, x="k", y="formula_iid", hue="kind", ax=ax, errorbar=None, linestyle="--", legend=False,
                 palette=palette)
    ax.set(title="Tokens per target pass: measured (solid) vs (1-a^(k+1))/(1-a) (dashed)",
           ylabel="tokens per target pass")
    return fig


def speedup_figure(points: pd.DataFrame):
    def draw(ax, g):
        ax.plot(g.k, g.predicted_iid, "s--", label="i.i.d. geometric", color=PREDICTOR_COLORS[0])
        ax.plot(g.k, g.predicted_empirical, "^:", label="empirical + overhead", color=PREDICTOR_COLORS[1])
    return speedup_panels(points, sorted(points.kind.unique()), draw, "Predicted vs measured speed-up")


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    plots = Path(params["metrics_dir"]) / "plots"
    boot = bootstrap_settings(params)
    campaign = published_campaign(params)
    acc = read_stage(params["outputs_dir"], "acceptance", campaign)
    speed = read_stage(params["outputs_dir"], "speed", campaign)
    if acc.empty or speed.empty:
        raise AnalysisError(f"needs acceptance and speed results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=all campaign={campaign}`")
    acc, speed = formula_acceptance(acc), formula_speed(speed)
    drift = read_drift(params, speed)
    if params["drift"]["exclude"]:
        speed = drop_drifted(speed, drift)
        if speed.empty:
            raise AnalysisError(f"every speed job drifted by more than x{params['drift']['max_ratio']}; rerun the "
                                "speed sweep on a quieter machine, or set drift.exclude: false in params.yaml")
    tab = acceptance_table(acc, boot)
    points = speed_points(speed, tab, boot)
    errors = predictor_errors(points)
    figures = {"alpha_by_k.png": alpha_figure(tab), "tokens_per_pass.png": tokens_figure(tab),
               "speedup_predicted_vs_measured.png": speedup_figure(points)}
    data = plot_data(tab, points)
    # Everything is computed; only now are outputs replaced (each atomically).
    save_table(tab, out / "acceptance_table.parquet")
    save_table(points, out / "speed_points.parquet")
    save_table(errors, out / "predictor_errors.parquet")
    for name, fig in figures.items():
        save_figure(fig, figs / name)
    for name, df in data.items():
        save_csv(df, plots / name)
    print(errors.to_string(index=False))


if __name__ == "__main__":
    run_script("analysis.fit", main)
