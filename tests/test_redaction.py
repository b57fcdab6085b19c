"""No secret in a record: a tracking URI's password and token are masked in everything a job writes or prints
(Parquet provenance, MLflow tags, params and artifacts, the job record, Hydra's files and log lines, stdout and
stderr), while the job still connects with the URI as given."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.redact import RedactFilter, redact, redact_all
from store.records import read_meta

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ("S3cretPw", "T0kenX")


@pytest.mark.parametrize("text, expected", [
    ("http://alice:S3cretPw@host:5000", "http://alice:***@host:5000"),
    ("mlflow.tracking_uri=https://alice:p%40ss@host/x k=2", "mlflow.tracking_uri=https://alice:***@host/x k=2"),
    ("https://alice:p@ss@host/x", "https://alice:***@host/x"),  # an unencoded '@' in the password
    ("http://host/?token=T0kenX&run=3", "http://host/?token=***&run=3"),
    ("http://host/api?access_token=a&X-Amz-Signature=b&keyboard=c", "http://host/api?access_token=***&X-Amz-Signature=***&keyboard=c"),
    ("'databricks://u:T0kenX@ws'", "'databricks://u:***@ws'"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("http://alice@host/", "http://alice@host/"),  # a user name alone is no secret
    ("no uri here: a:b@c", "no uri here: a:b@c"),
])
def test_redact(text, expected):
    assert redact(text) == expected


def test_redact_all_and_the_log_filter():
    assert redact_all({"a": ["http://u:pw@h", 3], "b": {"c": "x?token=t"}}) == \
        {"a": ["http://u:***@h", 3], "b": {"c": "x?token=t"}}  # no scheme, no URI
    record = logging.LogRecord("x", logging.INFO, "f", 1, "#0 : %s", ("uri=http://u:S3cretPw@h",), None)
    assert RedactFilter().filter(record) and record.getMessage() == "#0 : uri=http://u:***@h"


# A tracking URI with credentials that a test can reach: an MLflow store scheme whose builder opens a sqlite
# store (and notes the URI it was given, to show the job connects with the secret intact).
RUNNER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    def build(store_uri=None, artifact_uri=None):
        Path(os.environ["SEEN"]).write_text(store_uri)
        return SqlAlchemyStore(os.environ["DB"], os.environ["ARTIFACTS"])

    _tracking_store_registry.register("speclabtest", build)
    import runpy
    sys.argv = ["pipeline/run.py", *sys.argv[1:]]
    runpy.run_module("pipeline.run", run_name="__main__", alter_sys=True)
""")


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_is_nowhere(tmp_path):
    import mlflow

    work, seen = tmp_path / "work", tmp_path / "seen.txt"
    work.mkdir()
    db = f"sqlite:///{work / 'mlflow.db'}"
    uri = "speclabtest://alice:S3cretPw@tracking.example/x?token=T0kenX"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SEEN": str(seen), "DB": db, "ARTIFACTS": str(work / "artifacts")}
    env.pop("HYDRA_FULL_ERROR", None)
    res = subprocess.run(
        [sys.executable, "-c", RUNNER, "-m", "pair=tiny_random", "prompts=smoke", "max_new_tokens=4", "device=cpu",
         "stage=acceptance", f"outputs_dir={work / 'outputs'}", f"hydra.sweep.dir={work / 'sweep'}",
         f"mlflow.tracking_uri='{uri}'", "k=2"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert seen.read_text() == uri  # the store was opened with the credentials

    # Nothing written anywhere holds a secret: Parquet, mlflow.db (tags, params, run names), artifacts, job
    # record, Hydra's .hydra/*.yaml, multirun.yaml and run.log; nor stdout or stderr.
    leaks = [str(p) for p in _files(work) for s in SECRETS if s.encode() in p.read_bytes()]
    assert not leaks
    for s in SECRETS:
        assert s not in res.stdout and s not in res.stderr
    masked = "speclabtest://alice:***@tracking.example/x?token=***"
    assert masked in res.stdout  # Hydra's own launcher line, through the log filter

    # ... and the records still say which store was used.
    parquet = next((work / "outputs").rglob("*.parquet"))
    assert f"mlflow.tracking_uri='{masked}'" in read_meta(parquet)["overrides"]
    record = json.loads(next((work / "sweep").rglob("speclab_job.json")).read_text())
    assert masked in record["overrides"]
    client = mlflow.MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id])
    levels = {r.data.tags.get("level") for r in runs}
    assert {"sweep", "stage"} <= levels
    for run in runs:
        assert all(s not in json.dumps([run.data.tags, run.data.params]) for s in SECRETS)
        if run.data.tags.get("level") in ("sweep", "stage"):
            assert masked in run.data.tags["overrides"]
    stage = next(r for r in runs if r.data.tags.get("level") == "stage")
    config = Path(client.download_artifacts(stage.info.run_id, "config.yaml", str(tmp_path))).read_text()
    assert masked in config and "S3cretPw" not in config
