"""One ``llama-server`` process: started on 127.0.0.1, waited for, asked, and stopped on every exit path.

A server is this process's child with ``PR_SET_PDEATHSIG``: when the job dies, even by SIGKILL, the kernel
kills the server too. Normal ends (return, exception, Ctrl-C, SIGTERM) stop it in ``close`` and, as a last
resort, in an ``atexit`` hook. Every failure is a ``ServerError`` whose message is one line: what failed and
the last line the server logged.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
_LIVE: set[LlamaServer] = set()
# llama.cpp's log lines: "0.02.199.105 E llama_model_load: error loading model: ..." (time, level, text)
_LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([A-Z]) (.*)$")


class ServerError(RuntimeError):
    """A llama-server that could not start, answer or keep running, said in one line."""

    one_line = True  # the pipeline prints it as it is (pipeline/jobs/errors.py)


@dataclass(frozen=True)
class ServerSpec:
    """What a server is started with: its binary, model, draft settings and resources, as argv."""

    binary: str
    model: str
    args: tuple[str, ...] = ()      # speculative settings and any extra options, already as flags
    threads: int = 2
    ctx_size: int = 2048
    port: int = 0                   # 0: a free port chosen here
    startup_timeout_s: float = 180.0
    request_timeout_s: float = 600.0

    def argv(self, port: int) -> list[str]:
        return [self.binary, "-m", self.model, "--host", HOST, "--port", str(port), "-t", str(self.threads),
                "-tb", str(self.threads), "-c", str(self.ctx_size), "--parallel", "1", "--no-webui",
                "--cache-ram", "0", *self.args]


def _die_with_parent(parent: int) -> None:
    """Runs in the child between fork and exec. The kernel's signal comes when the *thread* that started the server
    ends, so servers are started from the job's main thread."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent:  # the job died before the request took effect: nobody would kill this server
        os._exit(1)
    os.setpgrp()  # Ctrl-C in the terminal reaches the job, which stops the server itself


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


@dataclass(eq=False)
class LlamaServer:
    spec: ServerSpec
    name: str = "llama-server"
    log_dir: Path | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)
    port: int = field(default=0, init=False)
    log_path: Path | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> LlamaServer:
        binary = Path(self.spec.binary)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise ServerError(f"engine.binary={self.spec.binary!r} is not an executable file: run `make llama-cpp` "
                              "(or give the path of your own llama-server build)")
        if self.spec.port and port_in_use(self.spec.port):
            raise ServerError(f"port {self.spec.port} on {HOST} is in use by another process ({self.name} was to "
                              "listen there; engine.port=N puts the servers on N, N+1, ...): use engine.port=0 "
                              "(a free port for each server) or another port")
        self.port = self.spec.port or free_port()
        folder = self.log_dir or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log", dir=folder)
        os.close(fd)
        self.log_path = Path(name)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.spec.argv(self.port), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=functools.partial(_die_with_parent, os.getpid()))
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited at start ({self._exit_text()}): {self.why()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        raise ServerError(f"{self.name} did not answer /health within {self.spec.startup_timeout_s:.0f} s: "
                          f"{self.last_log_line()}")

    def _exit_text(self) -> str:
        code = self.proc.returncode if self.proc else None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit {code}"

    def _log_lines(self) -> list[str] | None:
        try:
            return [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except (OSError, AttributeError):
            return None

    def last_log_line(self) -> str:
        """The server's last non-empty log line (where it says why it stopped)."""
        lines = self._log_lines()
        if lines is None:
            return "no log"
        return lines[-1][:400] if lines else "its log is empty"

    def why(self, at_start: bool = True) -> str:
        """Why a server stopped, in one line, and where its whole log is. At start: its first error line
        (llama.cpp logs the cause, then how it cleaned up), else its last line; mid-job its last line (a crash
        ends the log; an earlier error line may be a refused request it survived)."""
        lines = self._log_lines()
        if lines is None:
            return "no log"
        errors = [m.group(2) for m in map(_LOG_LINE.match, lines) if m and m.group(1) == "E"]
        reason = errors[0][:400] if errors and at_start else self.last_log_line()
        return f"{reason} (its log: {self.log_path})"

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON and return the answer; a dead server or an error answer is a ServerError."""
        if self.proc is None:
            raise ServerError(f"{self.name} is not running")
        data = json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.spec.request_timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            try:
                body = json.loads(body).get("error", {}).get("message", body)
            except (ValueError, AttributeError):
                pass
            raise ServerError(f"{self.name} refused {path} (HTTP {err.code}): {str(body)[:300]}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
            time.sleep(0.2)
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} died mid-job ({self._exit_text()}): "
                                  f"{self.why(at_start=False)}") from None
            raise ServerError(f"{self.name} at {self.url} did not answer {path} ({err}): "
                              f"{self.last_log_line()}") from None

    def close(self) -> None:
        """Stop the server; its log is kept only when it had stopped by itself (a failure to read)."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def close_all() -> None:
    """Stop every server this process started (the atexit hook; also called when a job ends)."""
    for server in list(_LIVE):
        server.close()


atexit.register(close_all)
