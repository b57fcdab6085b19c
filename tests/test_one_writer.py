"""One writer per job: two identical jobs started at once on a new tracking store give one file, one
FINISHED run and one line from the job that waited; a recomputed file's older runs are superseded."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.jobs.identity import config_hash, output_path
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
FAST = ("stage=acceptance", "max_new_tokens=6")


def _runs(uri: str, cfg, level: str = "stage") -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("speclab")
    return client.search_runs([exp.experiment_id], f"tags.config_hash = '{config_hash(cfg)}' and "
                              f"tags.stage = 'acceptance' and tags.level = '{level}'")


@pytest.mark.slow
def test_two_identical_jobs_at_once_write_one_file_and_one_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"  # a new store: both jobs find it missing
    go = tmp_path / "go"
    # The job that gets the lock computes until the test has seen the other one wait.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os, time, pipeline.stages.acceptance as a\n"
        "real = a.run\n"
        f"def run(ctx):\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.1)\n"
        "    return real(ctx)\n"
        "a.run = run\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    env.pop("SPECLAB_TRACKING_DOWN", None)
    procs, logs = [], []
    for i in range(2):
        logs.append((open(tmp_path / f"out{i}", "w+"), open(tmp_path / f"err{i}", "w+")))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pipeline.run", "pair=tiny_random", "prompts=smoke", "device=cpu", *FAST,
             f"outputs_dir={tmp_path / 'outputs'}", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path}/h{i}"],
            cwd=ROOT, env=env, stdout=logs[i][0], stderr=logs[i][1]))
    deadline = time.monotonic() + 180
    while not any("waiting for it" in (tmp_path / f"err{i}").read_text() for i in range(2)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    go.touch()
    codes = [p.wait(timeout=180) for p in procs]
    err = [(tmp_path / f"err{i}").read_text() for i in range(2)]
    out = [(tmp_path / f"out{i}").read_text() for i in range(2)]
    assert codes == [0, 0], err

    waited = [i for i in range(2) if "waiting for it" in err[i]]
    assert len(waited) == 1, err
    w = waited[0]
    lines = [ln for ln in err[w].splitlines() if "waiting for it" in ln]
    assert len(lines) == 1 and re.search(rf"is being computed by pid {procs[1 - w].pid} on ", lines[0]), lines
    assert "already complete" in out[w]
    assert not any(word in e for e in err for word in ("unreachable", "failed", "Traceback")), err

    cfg = make_cfg(tmp_path, *FAST)
    assert [p.name for p in (tmp_path / "outputs").rglob("*.parquet")] == [output_path(cfg, "acceptance").name]
    assert [r.info.status for r in _runs(uri, cfg)] == ["FINISHED"]


def test_a_recomputed_file_supersedes_its_older_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *FAST, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    [old] = _runs(uri, cfg)
    old_arms = {r.info.run_id for r in _runs(uri, cfg, "arm")}
    assert old_arms and old.data.tags["superseded"] == "false"

    run_parts(make_cfg(tmp_path, *FAST, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}", "force=true"))
    runs = {r.info.run_id: r.data.tags for r in _runs(uri, cfg)}
    assert len(runs) == 2
    [new] = set(runs) - {old.info.run_id}
    assert runs[old.info.run_id]["superseded"] == "true" and runs[old.info.run_id]["superseded_by"] == new
    assert runs[new]["superseded"] == "false"
    arms = {r.info.run_id: r.data.tags for r in _runs(uri, cfg, "arm")}
    assert all((tags["superseded"] == "true") == (rid in old_arms) for rid, tags in arms.items())
    # What the MLflow UI shows with the filter the run's tag documents: one stage run for the one file.
    import mlflow

    client = mlflow.MlflowClient(uri)
    current = client.search_runs([client.get_experiment_by_name("speclab").experiment_id],
                                 f"tags.config_hash = '{config_hash(cfg)}' and tags.level = 'stage' "
                                 "and tags.superseded = 'false'")
    assert [r.info.run_id for r in current] == [new]


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [4])
def test_a_new_sqlite_store_is_created_once(tmp_path, jobs):
    """Processes that find a store missing at once: one creates it, the others use it (none is told
    it is unreachable, as with an "online migration" error of two creators)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import sys, pipeline.tracking.mlflow_runs as t\n"
            "from pipeline.tracking.mlflow_runs import Tracker\n"
            "problem = t.tracking_problem(sys.argv[1])\n"
            "tr = Tracker(sys.argv[1], 'speclab', problem is None)\n"
            "print(problem or tr.start('probe', {'level': 'probe'}, {}, {}) or 'no run')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SPECLAB_TRACKING_DOWN", None)
    procs = [subprocess.Popen([sys.executable, "-c", code, uri], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(jobs)]
    results = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    ids = [out.strip() for out, _ in results]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), results


def test_a_waiter_names_a_holder_that_writes_its_line_just_after_taking_the_lock(tmp_path):
    import fcntl
    import threading

    from store.locks import file_lock

    lock = tmp_path / "x.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # taken, its line not yet written
    seen: list[str] = []
    waiter = threading.Thread(target=lambda: file_lock(lock, seen.append).__enter__())
    waiter.start()
    time.sleep(0.3)
    os.pwrite(fd, b"pid 1 on elsewhere\n", 0)
    time.sleep(0.3)
    os.close(fd)
    waiter.join(timeout=10)
    assert seen == ["pid 1 on elsewhere"]


def test_a_released_lock_leaves_no_holder_line(tmp_path):
    from store.locks import file_lock

    lock = tmp_path / "x.lock"
    with file_lock(lock):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")
    assert lock.read_text() == ""
