"""Faults around a job: a kill while logging, a damaged file at the job's own path, a dead tracking
server, a full disk. A job is done only when its Parquet and its FINISHED run both exist."""
from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.jobs.identity import config_hash, output_path
from store.records import check_stage_file, read_meta
from pipeline.run import run_parts
from pipeline.stages import acceptance
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
FAST = ("stage=acceptance", "max_new_tokens=6")


def _tracked(tmp_path, *extra):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return make_cfg(tmp_path, *FAST, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}", *extra), uri


def _runs(uri: str, cfg) -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("speclab")
    return [] if exp is None else client.search_runs(
        [exp.experiment_id], f"tags.config_hash = '{config_hash(cfg)}' and tags.stage = 'acceptance' and tags.level = 'stage'")


def _job_script(tmp_path, patch: str, uri: str) -> subprocess.CompletedProcess:
    """Run the CLI job of ``_tracked`` in a child process with ``patch`` applied first (the injected fault)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, runpy, signal, sys, time
        import pipeline.tracking.mlflow_runs
        {patch}
        sys.argv = ["pipeline.run", "pair=tiny_random", "prompts=smoke", "max_new_tokens=12", "device=cpu",
                    "outputs_dir={tmp_path / 'outputs'}", "stage=acceptance", "max_new_tokens=6",
                    "mlflow.enabled=true", "mlflow.tracking_uri={uri}", "hydra.run.dir={tmp_path}/hydra"]
        runpy.run_module("pipeline.run", run_name="__main__")
    """))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=180)


@pytest.mark.slow
def test_kill_between_parquet_and_run_isrepaired_on_rerun(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger='speclab')
    cfg, uri = _tracked(tmp_path)
    # SIGKILL cannot be caught: the child dies with its Parquet written and its run still RUNNING.
    res = _job_script(tmp_path, "pipeline.tracking.mlflow_runs.Tracker.finish = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)",
                      uri)
    assert res.returncode == -signal.SIGKILL, res.stderr
    path = output_path(cfg, "acceptance")
    assert check_stage_file(path, acceptance.SCHEMA, config_hash(cfg)) is None
    assert [r.info.status for r in _runs(uri, cfg)] == ["RUNNING"]
    stamp = path.stat().st_mtime_ns

    run_parts(cfg)  # the rerun: closes the dead run, logs the missing one from the file, recomputes nothing
    assert "logged it from the file" in caplog.text
    assert path.stat().st_mtime_ns == stamp
    runs = {r.info.status: r for r in _runs(uri, cfg)}
    assert set(runs) == {"KILLED", "FINISHED"}
    done = runs["FINISHED"]
    assert done.data.tags["logged_from_file"] == "true" and 0 <= done.data.metrics["alpha"] <= 1
    run_parts(cfg)
    assert "already complete" in caplog.text and len(_runs(uri, cfg)) == 2


@pytest.mark.slow
def test_sigterm_marks_the_run_killed_and_writes_nothing(tmp_path):
    cfg, uri = _tracked(tmp_path)
    res = _job_script(tmp_path, "import pipeline.stages.acceptance as a; "
                                "a.run = lambda ctx: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(30))", uri)
    assert res.returncode != 0
    assert [r.info.status for r in _runs(uri, cfg)] == ["KILLED"]
    assert not output_path(cfg, "acceptance").exists()


@pytest.mark.slow
def test_a_failing_job_marks_its_run_failed(tmp_path, monkeypatch):
    cfg, uri = _tracked(tmp_path)
    monkeypatch.setattr(acceptance, "run", lambda ctx: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_parts(cfg)
    run = _runs(uri, cfg)[0]
    assert run.info.status == "FAILED" and run.info.end_time >= run.info.start_time


@pytest.mark.slow
def test_the_run_spans_the_job(tmp_path, monkeypatch):
    cfg, uri = _tracked(tmp_path)
    real = acceptance.run
    monkeypatch.setattr(acceptance, "run", lambda ctx: (time.sleep(1.5), real(ctx))[1])
    run_parts(cfg)
    run = _runs(uri, cfg)[0]
    assert run.info.status == "FINISHED" and run.info.end_time - run.info.start_time >= 1500


def _foreign_parquet(path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2]}), path)


def _other_job(path: Path) -> None:
    """A real stage file of this schema, but written for another config."""
    table = pq.read_table(path)
    meta = {**read_meta(path), "config_hash": "0123456789abcdef"}
    import json

    pq.write_table(table.replace_schema_metadata({b"speclab": json.dumps(meta).encode()}), path)


CORRUPTIONS = {
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "random": lambda p: p.write_bytes(os.urandom(4096)),
    "foreign_parquet": _foreign_parquet,
    "other_config": _other_job,
    "rows_dropped": lambda p: pq.write_table(pq.read_table(p).slice(0, 1), p),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_damaged_file_at_the_jobs_path_is_recomputed(tmp_path, caplog, how):
    caplog.set_level(logging.INFO, logger='speclab')
    cfg = make_cfg(tmp_path, *FAST)
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    good = pq.read_table(path).to_pandas()
    CORRUPTIONS[how](path)
    assert check_stage_file(path, acceptance.SCHEMA, config_hash(cfg)) is not None
    run_parts(cfg)
    assert "is not a finished result" in caplog.text
    assert check_stage_file(path, acceptance.SCHEMA, config_hash(cfg)) is None
    assert len(pq.read_table(path)) == len(good)


def test_files_are_readable_by_others(tmp_path):
    old = os.umask(0o022)
    try:
        cfg = make_cfg(tmp_path, *FAST)
        run_parts(cfg)
    finally:
        os.umask(old)
    mode = output_path(cfg, "acceptance").stat().st_mode
    assert mode & stat.S_IRGRP and mode & stat.S_IROTH and not mode & stat.S_IWOTH


def test_full_disk_after_compute_keeps_the_rows(tmp_path, monkeypatch):
    import errno

    import store.records as parquet

    cfg = make_cfg(tmp_path, *FAST)
    real, calls = parquet.atomic_write, []

    def full_once(path, write):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, write)

    monkeypatch.setattr(parquet, "atomic_write", full_once)
    with pytest.raises(ValueError) as exc:
        run_parts(cfg)
    msg = str(exc.value)
    assert "\n" not in msg and "No space left on device" in msg and "the results are safe in" in msg
    rescued = Path(msg.split("the results are safe in ")[1].split(":")[0])
    assert check_stage_file(rescued, acceptance.SCHEMA, config_hash(cfg)) is None
    rescued.unlink()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("server", ["refused", "silent"])
def test_dead_tracking_server_costs_seconds_not_minutes(tmp_path, server):
    """A 2-job sweep against a tracking server that refuses connections, or accepts and never answers."""
    listener = None
    if server == "silent":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # accepts connections into its backlog, never reads or answers
        port = listener.getsockname()[1]
    else:
        port = _closed_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "SPECLAB_TRACKING_DOWN"):
        env.pop(var, None)
    start = time.monotonic()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pipeline.run", "-m", "k=1,2", "pair=tiny_random", "prompts=smoke", "device=cpu",
             "stage=acceptance", "max_new_tokens=6", f"outputs_dir={tmp_path / 'outputs'}",
             f"mlflow.tracking_uri=http://127.0.0.1:{port}", f"hydra.sweep.dir={tmp_path}/sweep"],
            cwd=ROOT, capture_output=True, text=True, env=env, timeout=170)
    finally:
        if listener:
            listener.close()
    elapsed = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "outputs").rglob("*.parquet"))) == 2
    said = [ln for ln in res.stderr.splitlines() if "unreachable" in ln]
    assert len(said) == 1, res.stderr
    assert elapsed < 60, f"{elapsed:.0f} s"


def _fresh_tracking_state(monkeypatch) -> None:
    import pipeline.tracking.mlflow_runs as tracking

    monkeypatch.setattr(tracking, "_down", {})
    monkeypatch.setattr(tracking, "_said", set())
    for var in (tracking.DOWN_ENV, tracking.DOWN_WHY_ENV, tracking.PARENT_ENV, tracking.SWEEP_PID_ENV):
        monkeypatch.setenv(var, "")  # recorded, so that what the job sets is undone after the test
        monkeypatch.delenv(var)


def test_a_full_disk_under_the_tracking_store_never_stops_the_measurement(tmp_path, monkeypatch, capsys):
    import errno
    from contextlib import contextmanager

    import pipeline.tracking.mlflow_runs as tracking

    _fresh_tracking_state(monkeypatch)

    @contextmanager
    def full(uri):  # writing the lock beside the sqlite file: what a full disk does to the first write
        raise OSError(errno.ENOSPC, "No space left on device")
        yield

    monkeypatch.setattr(tracking, "tracking_store_lock", full)
    cfg, uri = _tracked(tmp_path)
    run_parts(cfg)
    assert check_stage_file(output_path(cfg, "acceptance"), acceptance.SCHEMA, config_hash(cfg)) is None
    said = [ln for ln in capsys.readouterr().err.splitlines() if "No space left on device" in ln]
    assert len(said) == 1 and f"MLflow at {uri} is unreachable" in said[0] and ": :" not in said[0], said


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare to mount a small tmpfs")
def test_a_sqlite_store_on_a_full_disk_costs_a_joblib_sweep_nothing(tmp_path):
    """A real full disk: a 1 MiB tmpfs, filled, in a mount namespace of the job's own (gone when it exits)."""
    full = tmp_path / "full"
    full.mkdir()
    uri = f"sqlite:///{full}/mlflow.db"
    job = [sys.executable, "-m", "pipeline.run", "-m", "k=1,2", "+launcher=joblib", "pair=tiny_random",
           "stage=acceptance", "max_new_tokens=4", "prompts.per_kind=1", f"outputs_dir={tmp_path / 'outputs'}",
           f"mlflow.tracking_uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep"]
    script = (f"mount -t tmpfs -o size=1m tmpfs {full} && (dd if=/dev/zero of={full}/fill bs=64k 2>/dev/null; true)"
              ' && exec "$@"')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for var in ("SPECLAB_TRACKING_DOWN", "SPECLAB_TRACKING_DOWN_WHY"):
        env.pop(var, None)
    res = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *job], cwd=ROOT, capture_output=True,
                         text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list((tmp_path / "outputs").rglob("*.parquet"))) == 2
    said = [ln for ln in res.stderr.splitlines() if "unreachable" in ln or "failed" in ln]
    assert len(said) == 1 and uri in said[0] and "No space left on device" in said[0], res.stderr[-3000:]
    assert "speclab: error" not in res.stderr
