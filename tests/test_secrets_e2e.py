"""No credential of a tracking URI is ever written or printed: a job, a local multirun, a joblib multirun and
submitit's local launcher (which writes pickles and logs as it does under SLURM) log to a live MLflow server
behind a proxy that answers only the right credentials; then every file the run wrote (outputs, Hydra's
folders, the submitit folder), the server's store and what the run printed are searched for the secret, as
given and percent-encoded. A URI with secret query parameters is run against a closed port (the outage path).
"""
from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# A password with every character a user may leave unencoded: the lenient reading must take all of it, and the
# job must still connect with it. Each piece between them is searched for on its own (a partial leak counts).
PIECES = ("Sx7qA", "Kz9mB", "Vb3nC", "Wq5tD", "Jr8yE", "Lp2uF")
PASSWORD = "?".join(PIECES[:2]) + "#" + PIECES[2] + '"' + PIECES[3] + "@" + PIECES[4] + "/" + PIECES[5]
# Tokens given as the user name: with a placeholder password (as GitHub's), and alone (requests sends no
# credentials for a user name alone, so that form runs against the closed port).
TOKEN, LONE_TOKEN = "tok9f8e7d6c5b4a39281706f5e4d3c2b1a0", "tok0a1b2c3d4e5f60718293a4b5c6d7e8f9"
QUERY = {"pass": "qPass4417", "Authorization": "qAuth5521", "jwt": "qJwt6633"}
AUTH = {"alice": f"alice:{PASSWORD}", "token": f"{TOKEN}:x-oauth-basic"}
NEEDLES = (*PIECES, quote(PASSWORD, safe=""), TOKEN, LONE_TOKEN, *QUERY.values(),
           *(base64.b64encode(a.encode()).decode() for a in AUTH.values()))
JOB = ("pair=tiny_random", "stage=acceptance", "max_new_tokens=4", "prompts=smoke", "prompts.per_kind=1",
       "device=cpu", "threads=1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _AuthProxy(ThreadingHTTPServer):
    """Forwards to the MLflow server the requests that carry one of ``accepted`` (Authorization headers);
    answers 401 to any other, and counts both."""

    daemon_threads = True

    def __init__(self, backend: int, accepted: set[str]) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.backend, self.accepted, self.passed, self.refused = backend, accepted, 0, []


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _AuthProxy
    HOP = ("host", "authorization", "connection", "content-length", "transfer-encoding", "keep-alive")

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _forward(self) -> None:
        body = self._body()
        if self.headers.get("Authorization") not in self.server.accepted:
            self.server.refused.append(self.path)
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.passed += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.server.backend, timeout=120)
        conn.request(self.command, self.path, body=body,
                     headers={k: v for k, v in self.headers.items() if k.lower() not in self.HOP})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in self.HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A throwaway MLflow server on 127.0.0.1 (its store in a temporary folder) behind the auth proxy;
    stopped on every way out."""
    store = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = open(store / "server.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--artifacts-destination", str(store / "artifacts")],
        cwd=store, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proxy = None
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the MLflow server did not start: {(store / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        accepted = {"Basic " + base64.b64encode(a.encode()).decode() for a in AUTH.values()}
        proxy = _AuthProxy(port, accepted)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        yield {"store": store, "port": port, "proxy": proxy}
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _run(work: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m pipeline.run`` from ``work`` (so any stray relative path lands there too)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for var in ("HYDRA_FULL_ERROR", "SPECLAB_FULL_ERROR", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args, f"outputs_dir={work / 'outputs'}"],
                          cwd=work, capture_output=True, text=True, env=env, timeout=timeout)


def _leaks(res: subprocess.CompletedProcess, *folders: Path) -> list[str]:
    """Where any piece of any secret is found: a file under ``folders``, stdout or stderr."""
    found = [f"{p}: {n}" for folder in folders for p in folder.rglob("*") if p.is_file()
             for n in NEEDLES if n.encode() in p.read_bytes()]
    return found + [f"{name}: {n}" for name, text in (("stdout", res.stdout), ("stderr", res.stderr))
                    for n in NEEDLES if n in text]


def _stage_runs(port: int, experiment: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")  # the server itself, past the proxy
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id]) if exp else []
    return [r for r in runs if r.data.tags.get("level") == "stage"]


def _check_logged(server: dict, res: subprocess.CompletedProcess, work: Path, experiment: str, jobs: int) -> None:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not server["proxy"].refused, f"requests with wrong credentials: {server['proxy'].refused[:5]}"
    runs = _stage_runs(server["port"], experiment)
    assert len(runs) == jobs and all(r.info.status == "FINISHED" for r in runs)  # connected with the secret
    assert not _leaks(res, work, server["store"])
    assert "View run" not in res.stdout + res.stderr  # MLflow's own line (it would name the URI) is off


def test_a_job_connects_with_the_password_and_writes_it_nowhere(server, tmp_path):
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{server['proxy'].server_port}"
    res = _run(tmp_path, *JOB, f"mlflow.tracking_uri='{uri}'", "mlflow.experiment=single",
               f"hydra.run.dir={tmp_path / 'hydra'}")
    _check_logged(server, res, tmp_path, "single", 1)
    masked = f"http://alice:***@127.0.0.1:{server['proxy'].server_port}"
    assert masked in (tmp_path / "hydra" / ".hydra" / "overrides.yaml").read_text()  # the record names the store
    run = _stage_runs(server["port"], "single")[0]
    # Our own link to the run, without the credentials.
    assert f"http://127.0.0.1:{server['proxy'].server_port}/#/experiments/" \
           f"{run.info.experiment_id}/runs/{run.info.run_id}" in res.stdout


def test_a_local_multirun_with_a_token_as_user_name(server, tmp_path):
    uri = f"http://{TOKEN}:x-oauth-basic@127.0.0.1:{server['proxy'].server_port}"
    res = _run(tmp_path, "-m", *JOB, "k=1,2", f"mlflow.tracking_uri={uri}", "mlflow.experiment=multirun",
               f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _check_logged(server, res, tmp_path, "multirun", 2)
    assert r"http\://***\:***@127.0.0.1" in (tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml").read_text()


def test_a_joblib_multirun(server, tmp_path):
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{server['proxy'].server_port}"
    res = _run(tmp_path, "-m", "+launcher=joblib", *JOB, "k=1,2", f"mlflow.tracking_uri='{uri}'",
               "mlflow.experiment=joblib", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _check_logged(server, res, tmp_path, "joblib", 2)


def test_submitit_pickles_and_logs(server, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [slurm] extra is not installed")
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{server['proxy'].server_port}"
    res = _run(tmp_path, "-m", "hydra/launcher=submitit_local", *JOB, "k=1,2", f"mlflow.tracking_uri='{uri}'",
               "mlflow.experiment=submitit", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _check_logged(server, res, tmp_path, "submitit", 2)
    submitit = list((tmp_path / "sweep" / ".submitit").rglob("*"))
    assert any(p.suffix == ".pkl" for p in submitit) and any(p.name.endswith(".out") for p in submitit)


def test_a_lone_token_and_secret_query_parameters_on_an_unreachable_store(tmp_path):
    query = "&".join(f"{k}={v}" for k, v in QUERY.items())
    uri = f"http://{LONE_TOKEN}@127.0.0.1:{_free_port()}/?{query}&run=7"
    res = _run(tmp_path, "-m", *JOB, f"mlflow.tracking_uri='{uri}'", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not _leaks(res, tmp_path)
    assert "is unreachable" in res.stderr and "pass=***&Authorization=***&jwt=***&run=7" in res.stderr
    assert list((tmp_path / "outputs").rglob("*.parquet"))  # the measurement is written all the same
