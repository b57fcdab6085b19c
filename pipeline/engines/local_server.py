"""A server process an engine runs on this machine: started on 127.0.0.1, waited for, asked over HTTP, and stopped
on every exit path. The engines' servers (llama.cpp's ``llama-server``, vLLM's OpenAI-compatible server) are its
subclasses, which say how they start (``argv``, ``env``), where they answer when ready (``health_path``) and which log
line says why they failed (``error_lines``).

A server is this process's child with ``PR_SET_PDEATHSIG``: when the job dies, even by SIGKILL, the kernel kills the
server too; a server that spawns workers of its own runs under a guard that ends their whole process group
(``guarded``: pipeline/engines/server_guard.py). Normal ends
(return, exception, Ctrl-C, SIGTERM) stop it in ``close`` and, as a last resort, in an ``atexit`` hook. Every
failure is a ``ServerError`` whose message is one line: what failed and the line the server logged about it.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

HOST = "127.0.0.1"
GUARD = Path(__file__).with_name("server_guard.py")
_PR_SET_PDEATHSIG = 1
_LIVE: set[LocalServer] = set()


class ServerError(RuntimeError):
    """A server that could not start, answer or keep running, said in one line."""

    one_line = True  # the pipeline prints it as it is (pipeline/jobs/errors.py)


def _die_with_parent(parent: int, sig: int) -> None:
    """Runs in the child between fork and exec. The kernel's signal comes when the *thread* that started the server
    ends, so servers are started from the job's main thread."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
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
class LocalServer:
    """One server process. Subclasses give ``argv(port)``; the rest has defaults."""

    # A server that spawns workers runs under a guard (pipeline/engines/server_guard.py) that stops their whole process
    # group when the job dies (the kernel sends the guard SIGTERM) or stops it; a server of one process is killed
    # by the kernel directly (SIGKILL). A class attribute, not a constructor argument: the server's kind says it.
    guarded: ClassVar[bool] = False

    name: str = "server"
    log_dir: Path | None = None
    port_wanted: int = 0                 # 0: a free port chosen at start
    startup_timeout_s: float = 180.0
    request_timeout_s: float = 600.0
    health_path: str = "/health"
    proc: subprocess.Popen | None = field(default=None, init=False)
    port: int = field(default=0, init=False)
    log_path: Path | None = field(default=None, init=False)

    # -- what a subclass says --------------------------------------------------------------------------------------
    def argv(self, port: int) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def check_startable(self) -> None:
        """Refuse to start (ServerError, one line) what cannot start, before any process does."""

    def error_lines(self, lines: list[str]) -> list[str]:
        """The log lines that say what went wrong, first first (default: none recognised)."""
        return []

    # -- the process -------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> LocalServer:
        self.check_startable()
        if self.port_wanted and port_in_use(self.port_wanted):
            raise ServerError(f"port {self.port_wanted} on {HOST} is in use by another process ({self.name} was to "
                              "listen there; engine.port=N puts the servers on N, N+1, ...): use engine.port=0 "
                              "(a free port for each server) or another port")
        self.port = self.port_wanted or free_port()
        folder = self.log_dir or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{self.name.split()[0]}-", suffix=".log", dir=folder)
        os.close(fd)
        self.log_path = Path(name)
        with open(self.log_path, "wb") as log:
            argv = [sys.executable, str(GUARD), *self.argv(self.port)] if self.guarded else self.argv(self.port)
            death = signal.SIGTERM if self.guarded else signal.SIGKILL
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env(), preexec_fn=functools.partial(_die_with_parent, os.getpid(),
                                                                                      death))
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.close(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited at start ({self._exit_text()}): {self.why()}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.health_path}", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        raise ServerError(f"{self.name} did not answer {self.health_path} within {self.startup_timeout_s:.0f} s: "
                          f"{self.why()}")

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
        """Why a server stopped, in one line, and where its whole log is. At start: its first error line (a server
        logs the cause, then how it cleaned up), else its last line; mid-job its last line (a crash ends the log; an
        earlier error line may be a refused request it survived)."""
        lines = self._log_lines()
        if lines is None:
            return "no log"
        errors = self.error_lines(lines)
        reason = errors[0][:400] if errors and at_start else self.last_log_line()
        return f"{reason} (its log: {self.log_path})"

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> bytes:
        """Send one request and return the answer's body; a dead server or an error answer is a ServerError."""
        if self.proc is None:
            raise ServerError(f"{self.name} is not running")
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as r:
                return r.read()
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            try:
                parsed = json.loads(body)
                error = parsed.get("error", parsed)
                body = error.get("message", body) if isinstance(error, dict) else str(error)
            except (ValueError, AttributeError):
                pass
            raise ServerError(f"{self.name} refused {path} (HTTP {err.code}): {' '.join(str(body).split())[:300]}") \
                from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
            time.sleep(0.2)
            if self.proc is None or self.proc.poll() is not None:
                raise ServerError(f"{self.name} died mid-job ({self._exit_text()}): "
                                  f"{self.why(at_start=False)}") from None
            raise ServerError(f"{self.name} at {self.url} did not answer {path} ({err}): "
                              f"{self.last_log_line()}") from None

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON and return the answer (``request``'s errors)."""
        return json.loads(self.request("POST", path, payload))

    def get_text(self, path: str) -> str:
        return self.request("GET", path).decode(errors="replace")

    def close(self, keep_log: bool = False) -> None:
        """Stop the server and whatever it spawned (its process group); its log is kept when it had stopped by itself
        or failed to start (a failure to read)."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        running = proc.poll() is None
        if running:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=20)  # a guard gives its server 15 s to stop its workers
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        _signal_group(proc, signal.SIGKILL)  # workers left behind by a server that ended
        if running and not keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the server's process group (it leads one: ``_die_with_parent``), else the server alone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def close_all() -> None:
    """Stop every server this process started (the atexit hook; also called when a job ends)."""
    for server in list(_LIVE):
        server.close()


atexit.register(close_all)
