"""Publish the analysis to MLflow: one run `analysis-<campaign>` with the figures, report, metrics and tables.

    python -m analysis.publish     (the last `dvc repro` stage; runs only when what it publishes changed)
    make publish                   (the same, whenever asked: a fresh clone's store has no analysis run, and
                                    `dvc repro` there does nothing, since every stage is up to date)

The run goes to the experiment and tracking store of params.yaml's ``mlflow:`` section, tagged
``stage=analysis`` and ``campaign`` (MLflow adds ``mlflow.source.git.commit``), described by the answer on
one screen (analysis.answer; the report's first screen), with params.yaml
flattened as params, outputs/metrics/detail/headline.json's numbers as metrics (the dotted keys
`dvc metrics show outputs/metrics/detail/headline.json` prints),
every figure, report.md and its appendix as artifacts, and the key tables through ``mlflow.log_table``.

Logging is a side effect, not a DVC output: this stage writes nothing into the workspace, so a
second `dvc repro` does nothing and logs nothing. An unreachable store (3-second probe for http
URIs, no HTTP retries) is one line and the stage still succeeds; the files are the record.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from analysis.answer import read_answer, render_text
from analysis.common import load_params, published_campaign, read_table, run_script
from analysis.tracking import first_line, quick_http, tracking_settings, unreachable
from store.credentials import redact, redact_all
from store.identity import flatten
from store.records import UNKNOWN_COMMIT, git_commit

# Tables logged with mlflow.log_table (readable and comparable in the MLflow UI).
TABLES = ("answer/best", "answer/not_to_use", "speed_points", "acceptance_table", "predictor_errors", "best_k", "strategy_comparison", "drift",
          "spec_bench_table", "trees/tree_vs_chain", "trees/arms")


def numeric_metrics(tree: dict) -> dict[str, float]:
    """headline.json's numbers under their dotted keys (the strings, e.g. the campaign, are tags)."""
    return {k: float(v) for k, v in flatten(tree).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def publish(params: dict) -> str | None:
    """Log the run; returns its id, or None (disabled, unreachable, or failed: said in one line)."""
    tracking, campaign = tracking_settings(params), published_campaign(params)
    if not tracking.enabled:
        print("analysis.publish: MLflow disabled (params.yaml: mlflow.enabled); nothing logged")
        return None
    problem = unreachable(tracking.uri)
    if problem:
        print(f"analysis.publish: MLflow run not logged ({problem})")
        return None
    figs, metrics_dir = Path(params["figures_dir"]), Path(params["metrics_dir"])
    reports = [Path(params["outputs_dir"]) / name for name in ("report.md", "report_appendix.md")]
    headline = metrics_dir / "detail" / "headline.json"
    try:
        with quick_http():
            import mlflow

            client = mlflow.MlflowClient(tracking.uri)
            exp = client.get_experiment_by_name(tracking.experiment)
            exp_id = exp.experiment_id if exp else client.create_experiment(tracking.experiment)
            tags = {"stage": "analysis", "campaign": campaign}
            # The run's description (the UI's "Description"): the answer on one screen, as the report opens.
            ans = read_answer(params["analysis_dir"])
            if ans is not None:
                tags["mlflow.note.content"] = render_text(ans)
            # MLflow's own context tags (source, user, mlflow.source.git.commit when it finds the repository).
            from mlflow.tracking.context.registry import resolve_tags

            tags = resolve_tags(tags)
            if "mlflow.source.git.commit" not in tags and (commit := git_commit()) != UNKNOWN_COMMIT:
                tags["mlflow.source.git.commit"] = commit
            run = client.create_run(exp_id, run_name=f"analysis-{campaign}", tags=tags)
            run_id = run.info.run_id
            status = "FAILED"
            try:
                from mlflow.entities import Metric, Param

                flat = flatten(redact_all(params))  # a password in params.yaml's tracking URI stays out of the run
                client.log_batch(run_id, params=[Param(k, str(v)) for k, v in sorted(flat.items())])
                if headline.exists():
                    values = numeric_metrics(json.loads(headline.read_text()))
                    client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in sorted(values.items())])
                    client.log_artifact(run_id, str(headline), "metrics")
                for png in sorted(figs.glob("*.png")):
                    client.log_artifact(run_id, str(png), "figures")
                for report in (r for r in reports if r.exists()):
                    client.log_artifact(run_id, str(report))
                for name in TABLES:
                    table = read_table(params["analysis_dir"], name)
                    if not table.empty:
                        client.log_table(run_id, _jsonable(table), f"tables/{name}.json")
                status = "FINISHED"
            finally:
                client.set_terminated(run_id, status)
        print(f"analysis.publish: logged MLflow run analysis-{campaign} ({run_id}) to {redact(tracking.uri)}")
        return run_id
    except Exception as err:  # noqa: BLE001 - publishing is a convenience; the files are the record
        print(f"analysis.publish: MLflow run not logged ({first_line(err)})")
        return None


def _jsonable(df: pd.DataFrame) -> pd.DataFrame:
    """log_table writes JSON: nullable integers and booleans as plain Python values."""
    return df.astype(object).where(df.notna(), None)


def main() -> None:
    params = load_params()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    publish(params)


if __name__ == "__main__":
    run_script("analysis.publish", main)
