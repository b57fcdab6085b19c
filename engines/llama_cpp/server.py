"""One ``llama-server`` process (pipeline/engines/local_server.py ``LocalServer``): its command line, its binary
checked before it starts, and llama.cpp's error lines read from its log."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.engines.local_server import HOST, LocalServer, ServerError, close_all, free_port, port_in_use

# llama.cpp's log lines: "0.02.199.105 E llama_model_load: error loading model: ..." (time, level, text)
_LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([A-Z]) (.*)$")


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
    slots: int = 1                  # --parallel: requests decoded together, each with a context of ctx_size

    def argv(self, port: int) -> list[str]:
        return [self.binary, "-m", self.model, "--host", HOST, "--port", str(port), "-t", str(self.threads),
                "-tb", str(self.threads), "-c", str(self.ctx_size * self.slots), "--parallel", str(self.slots),
                "--no-webui",
                "--cache-ram", "0", *self.args]


class LlamaServer(LocalServer):
    def __init__(self, spec: ServerSpec, name: str = "llama-server", log_dir: Path | None = None) -> None:
        super().__init__(name=name, log_dir=log_dir, port_wanted=spec.port, startup_timeout_s=spec.startup_timeout_s,
                         request_timeout_s=spec.request_timeout_s)
        self.spec = spec

    def argv(self, port: int) -> list[str]:
        return self.spec.argv(port)

    def check_startable(self) -> None:
        binary = Path(self.spec.binary)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise ServerError(f"engine.binary={self.spec.binary!r} is not an executable file: run `make llama-cpp` "
                              "(or give the path of your own llama-server build)")

    def error_lines(self, lines: list[str]) -> list[str]:
        return [m.group(2) for m in map(_LOG_LINE.match, lines) if m and m.group(1) == "E"]


__all__ = ["HOST", "LlamaServer", "ServerError", "ServerSpec", "close_all", "free_port", "port_in_use"]
