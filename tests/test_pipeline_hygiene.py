"""Run hygiene: skip finished jobs, survive a dead tracking server, one-line errors for bad values."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.jobs import output_path
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
FAST = ("stage=acceptance", "max_new_tokens=6")


def test_rerun_skips_finished_job_unless_forced(tmp_path, capsys):
    cfg = make_cfg(tmp_path, *FAST)
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    stamp = path.stat().st_mtime_ns
    run_parts(cfg)
    assert "already complete" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == stamp
    run_parts(make_cfg(tmp_path, *FAST, "force=true"))
    assert path.stat().st_mtime_ns != stamp
    # A different config is a different job with its own file.
    other = make_cfg(tmp_path, *FAST, "k=2")
    assert output_path(other, "acceptance") != path


def test_unreachable_tracking_keeps_parquet(tmp_path, capsys, monkeypatch):
    # Nothing listens on port 1 of the loopback interface: the connection is refused at once.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    cfg = make_cfg(tmp_path, *FAST, "mlflow.enabled=true", "mlflow.tracking_uri=http://127.0.0.1:1")
    run_parts(cfg)
    err = capsys.readouterr()
    assert output_path(cfg, "acceptance").exists()
    assert "NOT logged to MLflow" in err.err and "not logged to MLflow" in err.out


def test_run_is_logged_to_mlflow(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *FAST, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    runs = mlflow.search_runs(experiment_names=["speclab"], filter_string="tags.stage = 'acceptance'")
    mlflow.set_tracking_uri(None)
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["params.k"] == "4" and row["params.pair.name"] == "tiny_random"
    assert 0 <= row["metrics.alpha.k4"] <= 1
    assert row["tags.dtype"] == "float32" and row["tags.device"] == "cpu" and row["tags.git_commit"]
    assert "tags.version.torch" in runs.columns


def _cli(tmp_path, *overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.run", "pair=tiny_random", "mlflow.enabled=false",
         f"outputs_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra", *overrides],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("overrides, expected", [
    (("k=0",), "k=0 is not allowed"),
    (("prompts.kinds=[]",), "the prompt set is empty"),
    (("prompts.kinds=[poetry]",), "prompt kinds ['poetry'] not in default.yaml"),
    (("stage.parts=[warp]",), "unknown stage ['warp']"),
])
def test_bad_values_are_one_line_errors(tmp_path, overrides, expected):
    res = _cli(tmp_path, *overrides)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("speclab: error:")]
    assert len(lines) == 1 and expected in lines[0], res.stderr


def test_unknown_pair_names_the_choices(tmp_path):
    res = _cli(tmp_path, "pair=no_such_pair")
    assert res.returncode != 0
    assert "no_such_pair" in res.stderr and "smollm2_int8" in res.stderr
