"""A local server that spawns workers stops with them on every exit path: its job ending, and its job SIGKILLed
(the kernel tells the guard, pipeline/engines/server_guard.py, which ends the server's whole process group). Without
the guard, a worker outlives a SIGKILLed job: the case the guard is for."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
# a server that answers /health and spawns a worker that ignores SIGTERM (as a busy vLLM worker may)
SERVER = textwrap.dedent('''
    import http.server, subprocess, sys
    worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print("worker", worker.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')
JOB = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from pipeline.engines.local_server import LocalServer
    class Fake(LocalServer):
        def argv(self, port):
            return [sys.executable, sys.argv[1], str(port)]
    s = Fake(name="fake-server", log_dir=Path(sys.argv[3]))
    s.guarded = sys.argv[2] == "1"
    s.start()
    print("started", s.proc.pid, flush=True)
    if sys.argv[4] == "close":
        time.sleep(3)  # the test notes the server's processes first
        s.close()
        print("closed", flush=True)
    else:
        time.sleep(600)
''')


def _run_job(tmp_path: Path, guarded: bool, end: str) -> tuple[subprocess.Popen, list[int]]:
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    job = subprocess.Popen([sys.executable, "-c", JOB, str(server), "1" if guarded else "0", str(tmp_path), end],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    line = job.stdout.readline()
    assert line.startswith("started"), line
    top = psutil.Process(int(line.split()[1]))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the server and its worker
        family = [top, *top.children(recursive=True)]
        if len([p for p in family if "sleep(600)" in _cmdline(p)]) == 1:
            return job, [p.pid for p in family]
        time.sleep(0.1)
    raise AssertionError("the fake server's worker did not start")


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _alive(pids: list[int], wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("end", ["close", "sigkill"])
def test_a_guarded_server_stops_with_its_workers(tmp_path, end):
    job, pids = _run_job(tmp_path, guarded=True, end=end)
    if end == "sigkill":
        job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    left = _alive(pids, wait_s=25)
    _cleanup(left)
    assert not left


def test_without_the_guard_a_worker_outlives_a_sigkilled_job(tmp_path):
    job, pids = _run_job(tmp_path, guarded=False, end="sigkill")
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    left = _alive(pids, wait_s=3)
    _cleanup(left)
    assert left  # the server died with the job (PR_SET_PDEATHSIG); its worker did not
