"""Every fault of the llama.cpp engine is one line, with nothing already written lost, and no server outlives its job.

Each case runs ``python -m pipeline.run engine=llama_cpp stage=speed`` on SmolLM2's own GGUF with a real
``llama-server`` (the build of ``make llama-cpp``): no binary, no build, a binary that dies at start, a port in
use, a flag the binary does not know, a GGUF that does not load, a draft with another vocabulary, a server that
dies mid-job; and a job killed by SIGKILL or interrupted by Ctrl-C leaves no server and no RUNNING run.
"""
from __future__ import annotations

import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

import pipeline.tracking.mlflow_runs as tracking

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TAG = "SPECLAB_TEST_TAG"  # set in a job's environment, which its servers inherit: how a test finds its own servers
JOB = ("engine=llama_cpp", "stage=speed", "pair=smollm2_int8", "prompts=smoke", "max_new_tokens=4", "stage.ks=[2]",
       "stage.timing_repeats=1", "stage.timing_warmup=0", "stage.arms=[{}]")
# A job that keeps its servers busy for a while (a kill always finds it running).
LONG = ("prompts.per_kind=3", "max_new_tokens=48", "stage.rounds=5")
OTHER_JOB = ("pair=tiny_random", "prompts=smoke", "device=cpu", "stage=acceptance", "max_new_tokens=4")


def _env(tag: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), TAG: tag, **extra}
    env.pop(tracking.DOWN_ENV, None)
    return env


def _args(outputs: Path, *extra: str, tracking_db: Path | None = None) -> list[str]:
    mlflow = [f"mlflow.tracking_uri=sqlite:///{tracking_db}"] if tracking_db else ["mlflow.enabled=false"]
    return [*JOB, f"outputs_dir={outputs}", f"hydra.run.dir={outputs.parent / 'hydra' / uuid.uuid4().hex[:8]}",
            *mlflow, *extra]


def _servers(tag: str) -> list[psutil.Process]:
    """The live llama-server processes of the jobs run with ``tag`` (a killed one's zombie is not live)."""
    found = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "llama-server" and p.status() != psutil.STATUS_ZOMBIE \
                    and p.environ().get(TAG) == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """An outputs folder holding another job's finished stage file, and every file's sha256 in it."""
    outputs = tmp_path_factory.mktemp("llama-faults") / "outputs"
    done = subprocess.run([sys.executable, "-m", "pipeline.run", *OTHER_JOB, f"outputs_dir={outputs}",
                           f"hydra.run.dir={outputs.parent / 'hydra-other'}", "mlflow.enabled=false"],
                          cwd=ROOT, env=_env("none"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = _files(outputs)
    assert any(name.endswith(".parquet") for name in files)
    return outputs, files


@pytest.fixture
def tag():
    """A tag for this test's jobs; any server of theirs still alive at the end is killed (and fails the test)."""
    tag = uuid.uuid4().hex
    yield tag
    left = _servers(tag)
    for p in left:
        p.kill()
    assert not left, f"llama-server processes left running: {[p.pid for p in left]}"


def _kept(written: tuple[Path, dict[str, str]]) -> None:
    outputs, before = written
    after = _files(outputs)
    assert {name: after.get(name) for name in before} == before, "a file written before the job changed or vanished"


def _error_line(done: subprocess.CompletedProcess | tuple[int, str]) -> str:
    """The job's one line: exit 2, no traceback, one ``speclab: error:`` line and it is the last line."""
    rc, err = (done.returncode, done.stderr) if isinstance(done, subprocess.CompletedProcess) else done
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in lines if ln.startswith("speclab: error")]
    assert errors == [lines[-1]] and lines[-1].startswith("speclab: error: "), err[-3000:]
    return lines[-1]


def _fail(written, tag: str, *extra: str, **env: str) -> str:
    outputs, _ = written
    done = subprocess.run([sys.executable, "-m", "pipeline.run", *_args(outputs, *extra)], cwd=ROOT,
                          env=_env(tag, **env), capture_output=True, text=True, timeout=600)
    line = _error_line(done)
    _kept(written)
    assert not _servers(tag)
    return line


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _counting_binary(tmp_path: Path) -> tuple[Path, Path]:
    """The real llama-server behind a script that notes each start: (the script, the file of its notes)."""
    from engines.llama_cpp.build import installed

    notes = tmp_path / "started"
    real = installed() / "llama-server"
    return _script(tmp_path / "llama-server", f'echo started >> "{notes}"\nexec "{real}" "$@"'), notes


# -- faults before or at a server's start ------------------------------------------------------------------------------
def test_a_binary_that_does_not_exist(written, tag):
    line = _fail(written, tag, "engine.binary=/nonexistent/llama-server")
    assert "engine.binary='/nonexistent/llama-server'" in line and "make llama-cpp" in line


def test_no_build_at_all_says_make_llama_cpp(written, tag, tmp_path):
    line = _fail(written, tag, SPECLAB_CACHE=str(tmp_path / "empty-cache"))
    assert "run `make llama-cpp`" in line and "engine.binary=" in line


def test_a_binary_that_dies_at_start_names_its_exit_and_last_log_line(written, tag, tmp_path):
    binary = _script(tmp_path / "llama-server", "echo 'loading the model'\n"
                                                "echo 'fatal: cannot open /dev/frobnicator' >&2\nexit 3")
    line = _fail(written, tag, f"engine.binary={binary}")
    assert "exited at start (exit 3): fatal: cannot open /dev/frobnicator" in line


def test_a_port_in_use_is_named(written, tag):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _fail(written, tag, f"engine.port={port}")
    assert f"port {port} on 127.0.0.1 is in use" in line and "engine.port=0" in line


def test_a_flag_the_binary_does_not_know_is_its_own_complaint(written, tag):
    line = _fail(written, tag, "engine.extra_args=[--no-such-flag]")
    assert "exited at start (exit 1)" in line and "invalid argument: --no-such-flag" in line


@pytest.mark.parametrize("start", [b"", b"GGUF\x03\x00\x00\x00"], ids=["no-magic", "garbage-header"])
def test_a_draft_that_is_not_gguf_is_named(written, tag, tmp_path, start):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(start + os.urandom(4096))
    line = _fail(written, tag, f"engine.draft_model={bad}")
    assert f"engine.draft_model='{bad}' is not a GGUF file llama.cpp can load" in line


def test_a_target_that_is_not_gguf_is_named(written, tag, tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(os.urandom(4096))
    assert str(bad) in _fail(written, tag, f"pair.target={bad}")


def test_a_gguf_whose_tensors_do_not_load_is_the_servers_own_line(written, tag, tmp_path):
    from speclab.models.loading import packaged_gguf_path

    cut = tmp_path / "cut.gguf"
    with open(packaged_gguf_path("smollm2-135m"), "rb") as f:
        cut.write_bytes(f.read(3 << 20))  # its header whole, its tensors cut off
    line = _fail(written, tag, f"engine.draft_model={cut}")
    assert "exited at start (exit 1)" in line and "not within the file bounds" in line


def test_a_draft_with_another_vocabulary_fails_before_any_server_starts(written, tag, tmp_path):
    import gguf
    import numpy as np

    draft = tmp_path / "other-vocab.gguf"
    writer = gguf.GGUFWriter(str(draft), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_tensor("token_embd.weight", np.zeros((100, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    binary, started = _counting_binary(tmp_path)
    line = _fail(written, tag, f"engine.draft_model={draft}", f"engine.binary={binary}")
    assert "vocabulary of 100 tokens" in line and "49152" in line
    assert not started.exists()


# -- a server that dies, a job that is killed ------------------------------------------------------------------------
def _start(outputs: Path, tag: str, *extra: str, tracking_db: Path | None = None) -> subprocess.Popen:
    args = _args(outputs, *LONG, *extra, tracking_db=tracking_db)
    return subprocess.Popen([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, env=_env(tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_servers(job: subprocess.Popen, tag: str, n: int, timeout: float = 240) -> list[psutil.Process]:
    """The job's servers once ``n`` of them run (oldest first)."""
    deadline = time.monotonic() + timeout
    while len(found := _servers(tag)) < n:
        if job.poll() is not None:
            pytest.fail(f"the job ended before {n} servers ran: {job.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            job.kill()
            pytest.fail(f"fewer than {n} llama-server processes within {timeout:.0f} s")
        time.sleep(0.1)
    return sorted(found, key=lambda p: p.create_time())


def _statuses(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return [status for (status,) in con.execute("select status from runs")]


@pytest.fixture
def job_killer():
    jobs: list[subprocess.Popen] = []
    yield jobs.append
    for job in jobs:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_a_server_that_dies_mid_job(written, tag, tmp_path, job_killer):
    outputs, _ = written
    db = tmp_path / "mlflow.db"
    job = _start(outputs, tag, tracking_db=db)
    job_killer(job)
    plain = _wait_servers(job, tag, 2)[0]  # the plain server, which has answered and will be asked again
    plain.kill()
    _, err = job.communicate(timeout=300)
    line = _error_line((job.returncode, err))
    assert "llama-server (target alone) died mid-job (killed by signal 9)" in line
    _kept(written)
    assert "RUNNING" not in _statuses(db) and "FAILED" in _statuses(db)


def test_a_sigkilled_job_leaves_no_server_and_the_next_job_no_running_run(written, tag, tmp_path, job_killer):
    outputs, _ = written
    db = tmp_path / "mlflow.db"
    job = _start(outputs, tag, tracking_db=db)
    job_killer(job)
    servers = _wait_servers(job, tag, 2)
    assert "RUNNING" in _statuses(db)
    job.send_signal(signal.SIGKILL)
    assert job.wait(timeout=30) == -signal.SIGKILL
    _, alive = psutil.wait_procs(servers, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], "servers outlived their SIGKILLed job"
    assert not _servers(tag)
    _kept(written)
    after = subprocess.run([sys.executable, "-m", "pipeline.run", *OTHER_JOB, "max_new_tokens=5",
                            f"outputs_dir={outputs}", f"hydra.run.dir={tmp_path / 'hydra-next'}",
                            f"mlflow.tracking_uri=sqlite:///{db}"],
                           cwd=ROOT, env=_env(tag), capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr[-3000:]
    statuses = _statuses(db)
    assert "RUNNING" not in statuses and "KILLED" in statuses and "FINISHED" in statuses


def test_ctrl_c_stops_the_servers(written, tag, job_killer):
    outputs, _ = written
    job = _start(outputs, tag)
    job_killer(job)
    servers = _wait_servers(job, tag, 2)
    os.killpg(job.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the job's process group
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert err.replace("\r", "\n").strip().splitlines()[-1].startswith("speclab: interrupted (Ctrl-C)")
    assert not [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    _kept(written)
