"""Drift: did the machine change speed during a speed job? Compare step times taken before and after.

    python -m analysis.drift      (reads the published campaign's speed results, writes
                                   outputs/analysis/drift.parquet and a figure)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt

from analysis.common import (load_params, published_campaign, read_stage, read_table, run_script, save_figure,
                             save_table)
from analysis.inputs import AnalysisError
from analysis.tracking import Tracking, first_line, quick_http, tracking_settings, unreachable

JOB_KEYS = ["pair", "config_hash"]
UNCHECKED = "unchecked"
# pipeline/jobs/trust.py's checks whose failure makes a job's numbers wrong, not only less sure: those jobs are flagged
# (and left out of the fits). Drift is judged here from the same before/after times at the analysis's own limit
# (drift.max_ratio); a loaded machine harms a job through drift; too few runs only widen an interval, which pooling
# jobs narrows: those stay visible in the trust column without a flag of their own.
EXCLUDING = ("placement",)


def failed_excluding(trust: pd.Series) -> pd.Series:
    """Whether each job's ``trust`` verdict (comma-separated failed checks) names a check in ``EXCLUDING``."""
    return trust.fillna(UNCHECKED).str.split(",").map(lambda checks: bool(set(checks) & set(EXCLUDING)))


def drift_table(speed: pd.DataFrame, max_ratio: float) -> pd.DataFrame:
    """One row per speed job: before/after step times, the larger of their ratios, the job's own ``trust``
    verdict (``ok``, the failed checks, or ``unchecked`` for files written before the checks), and the flag:
    drift above ``max_ratio``, or a failed job-time placement check (``EXCLUDING``).

    ``drift_ratio`` = max over target and draft of max(after/before, before/after) step time: the
    definition of the speed stage's MLflow metric ``drift_ratio`` as well.
    """
    if max_ratio <= 1:
        raise AnalysisError(f"drift.max_ratio={max_ratio} is not allowed: use a factor > 1 (e.g. 1.25)")
    cols = ["target_step_before_s", "target_step_after_s", "draft_step_before_s", "draft_step_after_s"]
    if "trust" not in speed:  # files written before the job-time checks (store.compat.LATER_COLUMNS)
        speed = speed.assign(trust=UNCHECKED)
    jobs = speed.groupby(JOB_KEYS, sort=True).agg(
        **{c: (c, "first") for c in cols}, trust=("trust", "first"),
        rounds=("round", "first"), kinds=("kind", lambda s: ",".join(sorted(set(s)))), runs=("arm", "size"),
    ).reset_index()

    def worst(a: pd.Series, b: pd.Series) -> pd.Series:
        return np.maximum(a / b, b / a)

    jobs["target_ratio"] = worst(jobs.target_step_after_s, jobs.target_step_before_s)
    jobs["draft_ratio"] = worst(jobs.draft_step_after_s, jobs.draft_step_before_s)
    jobs["drift_ratio"] = np.maximum(jobs.target_ratio, jobs.draft_ratio)
    jobs["flagged"] = (jobs.drift_ratio > max_ratio) | failed_excluding(jobs.trust)
    return jobs


def drop_drifted(speed: pd.DataFrame, drift: pd.DataFrame) -> pd.DataFrame:
    """The speed rows of the jobs the drift table does not flag."""
    flagged = set(drift.loc[drift.flagged, "config_hash"])
    return speed[~speed.config_hash.isin(flagged)]


def read_drift(params: dict, speed: pd.DataFrame) -> pd.DataFrame:
    """The drift table analysis.drift wrote (outputs/analysis/drift.parquet), checked to cover ``speed``'s jobs.

    fit, strategies and headline read it rather than recomputing it, so every script excludes the
    same jobs; a missing or stale table stops them with one line.
    """
    path = Path(params["analysis_dir"]) / "drift.parquet"
    drift = read_table(params["analysis_dir"], "drift")
    if drift.empty:
        raise AnalysisError(f"{path} is missing or empty; run `python -m analysis.drift` (or `dvc repro`)")
    missing = set(speed.config_hash) - set(drift.config_hash)
    if missing:
        raise AnalysisError(f"{path} does not cover speed job(s) {sorted(missing)[:3]} of the published campaign; "
                            "run `python -m analysis.drift` (or `dvc repro`)")
    return drift


def tag_mlflow(drift: pd.DataFrame, tracking: Tracking, campaign: str) -> int:
    """Tag each speed run of ``campaign`` with its drift verdict; returns the number tagged (0 when unreachable).

    Tags ``drift_flagged`` (true/false) and ``drift_ratio`` (3 decimals): the same name and definition as
    the ``drift_ratio`` metric the speed stage logs, max over target and draft of max(after/before,
    before/after) step time. Runs are found by stage, config hash and campaign (each job's child runs
    carry the same tags and are tagged too). Fail-soft: a store that cannot be reached is one line.
    """
    if not tracking.enabled:
        return 0
    problem = unreachable(tracking.uri)
    if problem:
        print(f"analysis.drift: MLflow tags not written ({problem})", file=sys.stderr)
        return 0
    try:
        with quick_http():
            import mlflow

            client = mlflow.MlflowClient(tracking.uri)
            exp = client.get_experiment_by_name(tracking.experiment)
            if exp is None:
                return 0
            n = 0
            for row in drift.itertuples():
                query = (f"tags.stage = 'speed' and tags.config_hash = '{row.config_hash}' "
                         f"and tags.campaign = '{campaign}'")
                token = None
                while True:
                    runs = client.search_runs([exp.experiment_id], query, max_results=1000, page_token=token)
                    for run in runs:
                        client.set_tag(run.info.run_id, "drift_flagged", str(bool(row.flagged)).lower())
                        client.set_tag(run.info.run_id, "drift_ratio", f"{row.drift_ratio:.3f}")
                        n += 1
                    token = runs.token
                    if not token:
                        break
            return n
    except Exception as err:  # noqa: BLE001 - tagging is a convenience; the table is the record
        print(f"analysis.drift: MLflow tags not written ({first_line(err)})", file=sys.stderr)
        return 0


def drift_figure(drift: pd.DataFrame, max_ratio: float):
    long = pd.concat([
        pd.DataFrame({"model": m, "before_ms": 1e3 * drift[f"{m}_step_before_s"],
                      "after_ms": 1e3 * drift[f"{m}_step_after_s"], "flagged": drift.flagged})
        for m in ("target", "draft")])
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=long, x="before_ms", y="after_ms", hue="model", style="flagged", ax=ax, s=50)
    hi = float(np.nanmax(long[["before_ms", "after_ms"]].to_numpy())) * 1.1 if len(long) else 1.0
    xs = np.linspace(0, hi, 50)
    ax.plot(xs, xs, color="grey", lw=1)
    ax.fill_between(xs, xs / max_ratio, xs * max_ratio, color="grey", alpha=0.12, label=f"within x{max_ratio}")
    ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="step time before the runs (ms)", ylabel="step time after (ms)",
           title="Drift: step times before vs after each speed job")
    ax.legend(fontsize=8)
    return fig


def main() -> None:
    params = load_params()
    out, figs = Path(params["analysis_dir"]), Path(params["figures_dir"])
    campaign = published_campaign(params)
    speed = read_stage(params["outputs_dir"], "speed", campaign)
    if speed.empty:
        raise AnalysisError(f"no speed results in campaign {campaign!r}; run "
                            f"`python -m pipeline.run +sweep=speed campaign={campaign}`")
    cfg = params["drift"]
    drift = drift_table(speed, float(cfg["max_ratio"]))
    figure = drift_figure(drift, float(cfg["max_ratio"]))
    # Everything is computed; only now are outputs replaced (each atomically).
    save_table(drift, out / "drift.parquet")
    save_figure(figure, figs / "drift.png")
    tagged = tag_mlflow(drift, tracking_settings(params), campaign) if cfg.get("tag_mlflow", True) else 0
    untrusted = int(failed_excluding(drift.trust).sum())
    print(f"analysis.drift: {int(drift.flagged.sum())} of {len(drift)} speed jobs flagged (drift above "
          f"x{cfg['max_ratio']}, or {untrusted} with a failed job-time placement check); "
          f"{tagged} MLflow runs tagged")


if __name__ == "__main__":
    run_script("analysis.drift", main)
