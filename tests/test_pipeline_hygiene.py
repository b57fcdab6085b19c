"""Run hygiene: skip finished jobs, log a finished run, file results by campaign."""
import logging
import os
import subprocess
import sys
from pathlib import Path

from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
FAST = ("stage=acceptance", "max_new_tokens=6")


def test_rerun_skips_finished_job_unless_forced(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger='speclab')
    cfg = make_cfg(tmp_path, *FAST)
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    stamp = path.stat().st_mtime_ns
    run_parts(cfg)
    assert "already complete" in caplog.text
    assert path.stat().st_mtime_ns == stamp
    run_parts(make_cfg(tmp_path, *FAST, "force=true"))
    assert path.stat().st_mtime_ns != stamp
    # A different config is a different job with its own file.
    other = make_cfg(tmp_path, *FAST, "k=2")
    assert output_path(other, "acceptance") != path


def test_run_is_logged_to_mlflow(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *FAST, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id],
                              "tags.stage = 'acceptance' and tags.level = 'stage'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["k"] == "4" and run.data.params["pair.name"] == "tiny_random"
    assert 0 <= run.data.metrics["alpha"] <= 1
    tags = run.data.tags
    assert tags["dtype"] == "float32" and tags["device"] == "cpu" and tags["mlflow.source.git.commit"]
    assert tags["campaign"] == "scratch" and "version.torch" in tags
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {output_path(cfg, "acceptance").name, "config.yaml"}


def test_campaign_files_results_apart(tmp_path):
    cfg = make_cfg(tmp_path, *FAST, "campaign=paper-v2")
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    assert path.parent == tmp_path / "outputs" / "campaigns" / "paper-v2" / "acceptance" and path.exists()
    # The campaign says where a result is filed, not what it measures: the same job keeps its hash.
    assert path.name == output_path(make_cfg(tmp_path, *FAST), "acceptance").name


def test_unknown_pair_names_the_choices(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "pipeline.run", "pair=no_such_pair", f"outputs_dir={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2
    assert "no_such_pair" in res.stderr and "smollm2_int8" in res.stderr
