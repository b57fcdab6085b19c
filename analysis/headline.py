"""The fit's numbers per pair: outputs/metrics/detail/headline.json, and as plain text on stdout.

    python -m analysis.headline    (reads outputs/analysis/*.parquet; a `dvc repro` stage)

headline.json holds, per pair (keys stay the same from commit to commit so
`dvc metrics diff --targets outputs/metrics/detail/headline.json` lines up; `dvc metrics show` itself shows the answer's
short table, analysis.answer.headline_row):
- ``best_k.<kind>`` and ``speedup_at_best_k.<kind>``: the fixed k with the highest measured speed-up
  (median of adjacent-run ratios, greedy, draft model) and that speed-up (its interval is in
  outputs/analysis/speed_points.parquet and the plots);
- ``alpha_at_k<K>.<kind>``: accepted / checked proposals at k = K (params.yaml: headline.alpha_k);
- ``mae_iid.<kind>`` and ``mae_empirical_overhead.<kind>``: mean absolute error of each predictor
  against the measured speed-up over that kind's k; ``.pooled``: over every (kind, k) point.
``<kind>`` is a prompt kind or ``all`` (kinds pooled), as in the tables.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import load_params, published_campaign, read_stage, read_table, run_script, save_json
from analysis.drift import drop_drifted, read_drift
from analysis.inputs import AnalysisError

PREDICTORS = {"mae_iid": "predicted_iid", "mae_empirical_overhead": "predicted_empirical"}


def _r(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 4)


def _clean(tree: dict) -> dict:
    """Drop missing values (JSON has no NaN) and empty groups."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            value = _clean(value)
            if value:
                out[key] = value
        elif value is not None:
            out[key] = value
    return out


def headline_metrics(campaign: str, points: pd.DataFrame, acc: pd.DataFrame, alpha_k: int) -> dict:
    """The metrics tree of headline.json (see the module docstring)."""
    metrics: dict = {"campaign": campaign}
    for pair in sorted(set(points.pair) | set(acc.pair)):
        p, a = points[points.pair == pair], acc[acc.pair == pair]
        m: dict = {"best_k": {}, "speedup_at_best_k": {}, f"alpha_at_k{alpha_k}": {}, **{name: {} for name in PREDICTORS}}
        for kind, g in p.groupby("kind", sort=True):
            best = g.loc[g.measured.idxmax()]
            m["best_k"][kind] = int(best.k)
            m["speedup_at_best_k"][kind] = _r(best.measured)
        for row in a[a.k == alpha_k].sort_values("kind").itertuples():
            m[f"alpha_at_k{alpha_k}"][row.kind] = _r(row.alpha)
        per_kind = p[p.kind != "all"]
        for name, col in PREDICTORS.items():
            m[name]["pooled"] = _r((per_kind[col] - per_kind.measured).abs().mean()) if len(per_kind) else None
            for kind, g in p.groupby("kind", sort=True):
                m[name][kind] = _r((g[col] - g.measured).abs().mean())
        metrics[pair] = m
    return _clean(metrics)


def print_tables(params: dict, out: Path, campaign: str) -> None:
    """The same numbers and more, as text (what the closing notes quote)."""
    pd.set_option("display.width", 200)
    acc = read_table(out, "acceptance_table")
    if not acc.empty:
        print("alpha (accepted/checked) per kind and k:")
        print(acc.pivot_table(index="kind", columns="k", values="alpha").round(3).to_string())
        print("tokens per target pass measured / i.i.d. formula:")
        t = acc.assign(v=acc.tokens_per_pass.round(2).astype(str) + " / " + acc.formula_iid.round(2).astype(str))
        print(t.pivot_table(index="kind", columns="k", values="v", aggfunc="first").to_string())
    pts = read_table(out, "speed_points")
    if not pts.empty:
        print("measured speed-up (median of adjacent-run ratios) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="measured").round(2).to_string())
        print("predicted (i.i.d.) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="predicted_iid").round(2).to_string())
        print("predicted (empirical acceptance + overhead) per kind and k:")
        print(pts.pivot_table(index="kind", columns="k", values="predicted_empirical").round(2).to_string())
    speed = read_stage(params["outputs_dir"], "speed", campaign)
    if not speed.empty:
        speed = drop_drifted(speed, read_drift(params, speed))
        fixed = speed[(speed.arm == "speculative") & (speed.k_policy == "fixed") & (speed.drafter == "model")
                      & ~speed.do_sample]
        parts = ["draft_s_per_iter", "verify_s_per_iter", "rollback_s_per_iter", "bookkeeping_s_per_iter"]
        print("time per iteration (ms), greedy model draft, fixed k, drift-flagged jobs excluded:")
        print((1e3 * fixed.groupby("k")[parts].mean()).round(2).assign(runs=fixed.groupby("k").size()).to_string())
    for name in ("predictor_errors", "best_k", "drift", "divergence_counts", "distribution_rates",
                 "drafter_comparison", "adaptive_vs_fixed", "strategy_comparison"):
        df = read_table(out, name)
        if not df.empty:
            print(f"{name}:")
            print(df.round(4).to_string(index=False))
    sampled = read_table(out, "sampled_alpha")
    if not sampled.empty:
        print("sampled vs greedy alpha:")
        print(sampled[sampled.kind == "all"].round(3).to_string(index=False))
    strategies = read_table(out, "strategy_speedups")
    if not strategies.empty:
        print("strategy speed-ups:")
        print(strategies.round(3).to_string(index=False))


def main() -> None:
    params = load_params()
    out = Path(params["analysis_dir"])
    campaign = published_campaign(params)
    points, acc = read_table(out, "speed_points"), read_table(out, "acceptance_table")
    if points.empty or acc.empty:
        raise AnalysisError(f"{out / 'speed_points.parquet'} or {out / 'acceptance_table.parquet'} is missing or "
                            "empty; run `python -m analysis.fit` (or `dvc repro`)")
    alpha_k = int((params.get("headline") or {}).get("alpha_k", 4))
    metrics = headline_metrics(campaign, points, acc, alpha_k)
    print_tables(params, out, campaign)
    path = save_json(metrics, Path(params["metrics_dir"]) / "detail" / "headline.json")
    print(f"analysis.headline: wrote {path}")


if __name__ == "__main__":
    run_script("analysis.headline", main)
