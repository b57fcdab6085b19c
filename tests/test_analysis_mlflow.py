"""The analysis's MLflow side channel: drift tags on the right runs, the `analysis-<campaign>` run, and
fail-soft, quick behaviour when the store is off or unreachable."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.drift import tag_mlflow
from analysis.publish import publish
from analysis.tracking import tracking_settings

REPO = Path(__file__).resolve().parents[1]


def params_for(uri: str, enabled: bool = True) -> dict:
    """params.yaml with the committed outputs (read only) and the given store."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(outputs_dir=str(REPO / "outputs"), analysis_dir=str(REPO / "outputs" / "analysis"),
                  figures_dir=str(REPO / "outputs" / "figures"), metrics_dir=str(REPO / "outputs" / "metrics"))
    params["mlflow"] = {"enabled": enabled, "tracking_uri": uri, "experiment": "speclab"}
    return params


def test_drift_tags_and_analysis_run(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("speclab")

    def speed_run(config_hash: str, campaign: str, parent: str | None = None) -> str:
        tags = {"stage": "speed", "config_hash": config_hash, "campaign": campaign}
        if parent:
            tags["mlflow.parentRunId"] = parent
        return client.create_run(exp, tags=tags).info.run_id

    a = speed_run("aaaa", "reference")
    a_child = speed_run("aaaa", "reference", parent=a)
    a_scratch = speed_run("aaaa", "scratch")
    b = speed_run("bbbb", "reference")
    drift = pd.DataFrame({"config_hash": ["aaaa", "bbbb"], "flagged": [True, False], "drift_ratio": [1.33333, 1.0104]})

    assert tag_mlflow(drift, tracking_settings(params_for(uri)), "reference") == 3
    tags = {r: client.get_run(r).data.tags for r in (a, a_child, a_scratch, b)}
    assert tags[a]["drift_flagged"] == "true" and tags[a]["drift_ratio"] == "1.333"
    assert tags[a_child]["drift_ratio"] == "1.333"
    assert tags[b]["drift_flagged"] == "false" and tags[b]["drift_ratio"] == "1.010"
    assert "drift_ratio" not in tags[a_scratch]  # another campaign's run of the same config

    params = params_for(uri)
    run_id = publish(params)
    assert run_id
    run = client.get_run(run_id)
    assert run.info.run_name == f"analysis-{params['campaign']}" and run.info.status == "FINISHED"
    assert run.data.tags["stage"] == "analysis" and run.data.tags["campaign"] == params["campaign"]
    assert len(run.data.tags.get("mlflow.source.git.commit", "")) == 40
    assert run.data.params["bootstrap.samples"] == str(params["bootstrap"]["samples"])
    assert any(k.endswith(".speedup_at_best_k.all") for k in run.data.metrics)
    top = {f.path for f in client.list_artifacts(run_id)}
    assert {"figures", "tables", "metrics", "report.md"} <= top
    assert "tables/speed_points.json" in {f.path for f in client.list_artifacts(run_id, "tables")}
    assert "figures/strategies.png" in {f.path for f in client.list_artifacts(run_id, "figures")}


def test_unreachable_store_is_one_line_and_quick(capsys):
    params = params_for("http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.monotonic()
    assert publish(params) is None
    assert tag_mlflow(pd.DataFrame({"config_hash": ["a"], "flagged": [False], "drift_ratio": [1.0]}),
                      tracking_settings(params), "reference") == 0
    assert time.monotonic() - start < 8
    out = capsys.readouterr()
    assert out.out.count("\n") == 1 and out.out.startswith("analysis.publish: MLflow run not logged")
    assert out.err.count("\n") == 1 and out.err.startswith("analysis.drift: MLflow tags not written")


@pytest.mark.parametrize("uri", ["sqlite:///does/not/exist/mlflow.db"])
def test_disabled_or_missing_store_logs_nothing(tmp_path, capsys, uri):
    assert publish(params_for(f"sqlite:///{tmp_path / 'x.db'}", enabled=False)) is None
    assert not (tmp_path / "x.db").exists()
    assert publish(params_for(uri)) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "disabled" in lines[0] and "does not exist" in lines[1]
