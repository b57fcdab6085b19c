"""Every run ends: a job, a sweep or a joblib worker killed by a signal it cannot catch leaves no run
RUNNING once anything starts again, a joblib worker dies with its multirun, and an outage is reported
with when it began."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import pipeline.tracking.mlflow_runs as tracking
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
JOB = ("pair=tiny_random", "prompts=smoke", "device=cpu", "stage=acceptance", "max_new_tokens=6")
# The injected fault: the acceptance stage never ends by itself, so a kill always finds it running.
SLOW = ("import time, pipeline.stages.acceptance as a\n"
        "a.run = lambda ctx: time.sleep(120)\n")


def _statuses(db: Path) -> dict[str, str]:
    """run id -> status, read with sqlite3 (no MLflow client, which could repair what it reads)."""
    with sqlite3.connect(db) as con:
        return dict(con.execute("select run_uuid, status from runs"))


def _levels(db: Path, status: str) -> list[str]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select t.value from runs r join tags t on t.run_uuid = r.run_uuid "
                           "where r.status = ? and t.key = 'level'", (status,))
        return sorted(v for (v,) in rows)


def _pids(db: Path, level: str) -> list[int]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select p.value from runs r join tags l on l.run_uuid = r.run_uuid "
                           "join tags p on p.run_uuid = r.run_uuid where r.status = 'RUNNING' and l.key = 'level' "
                           "and l.value = ? and p.key = 'speclab.pid'", (level,))
        return sorted(int(v) for (v,) in rows)


def _start(tmp_path: Path, args: list[str], patch: str = SLOW) -> subprocess.Popen:
    """The CLI in a child process with ``patch`` applied at interpreter start (sitecustomize), so that
    it applies in joblib's worker processes too."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(patch)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    env.pop(tracking.DOWN_ENV, None)
    return subprocess.Popen([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _rerun(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop(tracking.DOWN_ENV, None)
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {what}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)


def _running(db: Path, level: str, n: int = 1):
    def ready() -> bool:
        try:
            return db.exists() and len(_pids(db, level)) >= n
        except sqlite3.OperationalError:  # the file exists, its tables are still being created
            return False
    return ready


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [*JOB, f"outputs_dir={tmp_path / 'outputs'}", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.run.dir={tmp_path}/hydra", f"hydra.sweep.dir={tmp_path}/sweep", *extra]


@pytest.mark.slow
def test_a_killed_job_leaves_no_run_running_after_the_rerun(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = _start(tmp_path, _args(tmp_path))
    _wait_for(_running(db, "stage"), proc, "RUNNING stage run")
    _kill(proc)
    assert _levels(db, "RUNNING") == ["job", "stage"]

    cfg = make_cfg(tmp_path, "stage=acceptance", "max_new_tokens=6", "mlflow.enabled=true",
                   f"mlflow.tracking_uri=sqlite:///{db}")
    run_parts(cfg)  # the rerun, in this process: another process, as after any kill
    assert "RUNNING" not in _statuses(db).values()
    assert _levels(db, "KILLED") == ["job", "stage"]
    assert _levels(db, "FINISHED").count("stage") == 1


@pytest.mark.slow
def test_a_killed_sweep_leaves_no_run_running_after_the_rerun(tmp_path):
    db = tmp_path / "mlflow.db"
    sweep = ["-m", "k=1,2", *_args(tmp_path)]
    proc = _start(tmp_path, sweep)
    _wait_for(_running(db, "stage"), proc, "RUNNING stage run")
    _kill(proc)
    assert _levels(db, "RUNNING") == ["stage", "sweep"]

    res = _rerun(tmp_path, sweep)
    assert res.returncode == 0, res.stderr
    assert "RUNNING" not in _statuses(db).values()
    assert _levels(db, "KILLED") == ["stage", "sweep"]
    assert _levels(db, "FINISHED").count("stage") == 2


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_joblib_workers_die_with_their_multirun(tmp_path):
    """An out-of-memory kill of a joblib sweep's parent: its workers end their jobs' runs and exit."""
    db = tmp_path / "mlflow.db"
    proc = _start(tmp_path, ["-m", "k=1,2", "+launcher=joblib", *_args(tmp_path)])
    _wait_for(_running(db, "stage", 2), proc, "two RUNNING stage runs (one per worker)")
    workers = _pids(db, "stage")
    assert proc.pid not in workers
    _kill(proc)

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30
    while not all(map(gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in workers if not gone(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "joblib workers outlived their multirun"
    # A worker ends its own runs on the way out when the store answers in time (two workers ending at once
    # can find sqlite locked); whatever is left RUNNING belongs to dead processes, and the next start ends it.
    assert set(_levels(db, "KILLED")) <= {"stage"}
    tracking.Tracker(f"sqlite:///{db}", "speclab", True).close_dead_runs()
    assert "RUNNING" not in _statuses(db).values()
    assert _levels(db, "KILLED") == ["stage", "stage", "sweep"]


def test_the_outage_message_says_when_the_store_went_away(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_down", {})
    monkeypatch.setattr(tracking, "_said", set())
    for var in (tracking.DOWN_ENV, tracking.DOWN_WHY_ENV, tracking.PARENT_ENV):
        monkeypatch.setenv(var, "")  # recorded, so that what the test sets is undone after it
        monkeypatch.delenv(var)
    missing = f"sqlite:///{tmp_path}/no/such/folder/mlflow.db"
    assert tracking.tracking_problem(missing, "multirun").startswith("found unreachable when the multirun started")
    tracking._down.clear()  # a job of the multirun in another process: told through the environment
    assert tracking.tracking_problem(missing).startswith("found unreachable when the multirun started")

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert tracking.tracking_problem(uri) is None
    monkeypatch.setenv(tracking.PARENT_ENV, "sweep-run-id")
    tracking._mark_down(uri, RuntimeError("database is locked"))
    for child in (False, True):
        if child:
            tracking._down.clear()
        problem = tracking.tracking_problem(uri)
        assert problem == "became unreachable during the multirun: RuntimeError: database is locked", problem


def test_only_runs_of_dead_processes_on_this_host_are_closed(tmp_path):
    """Anyone's run whose process is gone becomes KILLED; a live process's run, a run of another host
    (its process cannot be seen from here) and a run opened by something else stay as they are."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = tracking.Tracker(uri, "speclab", True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until the end of the test
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    me = tracking.process_tags()
    runs = {
        "alive": me,
        "dead": {**me, "speclab.pid": str(dead.pid)},
        "pid_reused": {**me, "speclab.pid_started": "0.0"},
        "zombie": {**me, "speclab.pid": str(zombie.pid),
                   "speclab.pid_started": repr(psutil.Process(zombie.pid).create_time())},
        "other_host": {**me, "speclab.host": "elsewhere", "speclab.pid": str(dead.pid)},
        "not_ours": {},
    }
    ids = {name: tracker.call(lambda c, t=tags, n=name: c.create_run(tracker._experiment_id, run_name=n, tags=t)
                               ).info.run_id for name, tags in runs.items()}
    assert tracker.close_dead_runs() == 3
    zombie.wait()
    client = mlflow.MlflowClient(uri)
    status = {name: client.get_run(rid).info.status for name, rid in ids.items()}
    assert status == {"alive": "RUNNING", "dead": "KILLED", "pid_reused": "KILLED", "zombie": "KILLED",
                      "other_host": "RUNNING", "not_ours": "RUNNING"}


TINY = ("pair=tiny_random", "stage=acceptance", "max_new_tokens=4", "prompts.per_kind=1", "device=cpu")


def _sweep(tmp_path: Path, patch: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """A tiny multirun in its own process group, ``patch`` applied in every process (sitecustomize); its
    stdout and stderr go to files (a pipe nobody reads could fill and stall it)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(patch)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    for var in (tracking.DOWN_ENV, tracking.DOWN_WHY_ENV, "HYDRA_FULL_ERROR"):
        env.pop(var, None)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    args = ["-m", *TINY, f"outputs_dir={tmp_path / 'outputs'}", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.sweep.dir={tmp_path}/sweep", *extra]
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, env=env, stdout=stdout,
                                stderr=stderr, start_new_session=True)
    return proc, out, err


def _sweep_to_end(tmp_path: Path, patch: str, timeout: float, *extra: str) -> tuple[int, str, str]:
    """``_sweep`` waited for (its process group ended whatever happens): exit status, stdout, stderr."""
    proc, out, err = _sweep(tmp_path, patch, *extra)
    try:
        proc.wait(timeout=timeout)
    finally:
        _end_group(proc)
    return proc.returncode, out.read_text(), err.read_text()


def _end_group(proc: subprocess.Popen) -> None:
    """Whatever is left of the multirun's process group (its workers included) is killed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


# Job k=2's worker is killed outright (as by the out-of-memory killer) once its models are loaded; k=1 runs in the
# other worker meanwhile, and k=3 waits for a free worker.
WORKER_KILLED = ("import os, signal, time, pipeline.stages.acceptance as a\n"
                 "real = a.run\n"
                 "def run(ctx):\n"
                 "    if int(ctx.cfg.k) == 2:\n"
                 "        os.kill(os.getpid(), signal.SIGKILL)\n"
                 "    time.sleep(3)\n"
                 "    return real(ctx)\n"
                 "a.run = run\n")


@pytest.mark.slow
def test_a_dead_joblib_worker_fails_its_job_alone(tmp_path):
    db = tmp_path / "mlflow.db"
    status, stdout, stderr = _sweep_to_end(tmp_path, WORKER_KILLED, 400, "k=1,2,3", "+launcher=joblib")
    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr and "TerminatedWorkerError" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == "speclab: error: job #1 (k=2) failed: worker killed by signal 9, SIGKILL"
    # The summary is true: every job, the dead one named with why, and the MLflow run it is logged on.
    assert "multirun of 3 jobs" in stdout, stdout[-3000:]
    rows = {line.split("|")[1].strip(): line for line in stdout.splitlines() if line.startswith("|") and "k=" in line}
    assert "| computed" in rows["0"] and "| computed" in rows["2"], rows
    assert "failed: worker killed by signal 9" in rows["1"], rows
    assert "MLflow: experiment 'speclab'" in stdout and "MLflow: not logged" not in stdout
    assert len(list((tmp_path / "outputs").rglob("*.parquet"))) == 2
    # Every run ended: the dead job's KILLED, the sweep's FAILED, the others' FINISHED (none cut short).
    assert "RUNNING" not in _statuses(db).values()
    assert _levels(db, "KILLED") == ["stage"]
    assert _levels(db, "FAILED") == ["sweep"]
    assert _levels(db, "FINISHED").count("stage") == 2


@pytest.mark.slow
@pytest.mark.parametrize("launcher, signum, to_group", [
    ("basic", signal.SIGINT, True),  # Ctrl-C in a terminal reaches every process of the multirun
    ("joblib", signal.SIGINT, True),
    ("joblib", signal.SIGTERM, False),  # kill PID, or a scheduler's polite stop: the multirun's process only
])
def test_an_interrupted_multirun_says_one_line_and_ends_its_runs(tmp_path, launcher, signum, to_group):
    db = tmp_path / "mlflow.db"
    extra = ["+launcher=joblib"] if launcher == "joblib" else []
    proc, _, err = _sweep(tmp_path, SLOW, "k=1,2", *extra)
    try:
        _wait_for(_running(db, "stage", 2 if launcher == "joblib" else 1), proc, "RUNNING stage runs")
        (os.killpg if to_group else os.kill)(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        _end_group(proc)
    stderr = err.read_text()
    lines = [ln for ln in stderr.splitlines() if ln.strip() and "%|" not in ln and "it/s]" not in ln]
    what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert lines == [lines[0]] and lines[0].startswith(f"speclab: {what}: "), stderr[-3000:]
    assert "RUNNING" not in _statuses(db).values()
    assert "sweep" in _levels(db, "KILLED") and "stage" in _levels(db, "KILLED")


# Ctrl-C lands while job k=2's stage run is being created: the run exists in the store, but the job never got its
# id back, so the job itself cannot end it.
CTRL_C_IN_CREATE_RUN = ("import os, signal, time, mlflow\n"
                        "real = mlflow.MlflowClient.create_run\n"
                        "def create_run(self, experiment_id, *args, **kwargs):\n"
                        "    run = real(self, experiment_id, *args, **kwargs)\n"
                        "    tags = kwargs.get('tags') or {}\n"
                        "    if tags.get('level') == 'stage' and str(kwargs.get('run_name')).startswith('k2 '):\n"
                        "        os.killpg(0, signal.SIGINT)\n"
                        "        time.sleep(5)\n"
                        "    return run\n"
                        "mlflow.MlflowClient.create_run = create_run\n"
                        "import pipeline.stages.acceptance as a\n"
                        "a.run = lambda ctx: time.sleep(120)\n")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [(), ("+launcher=joblib",)], ids=["basic", "joblib"])
def test_a_run_being_created_when_ctrl_c_lands_is_ended_too(tmp_path, launcher):
    db = tmp_path / "mlflow.db"
    status, _, stderr = _sweep_to_end(tmp_path, CTRL_C_IN_CREATE_RUN, 180, "k=1,2", *launcher)
    assert status == 128 + signal.SIGINT, stderr[-3000:]
    assert _levels(db, "KILLED").count("stage") >= 1, _statuses(db)
    assert "RUNNING" not in _statuses(db).values()
