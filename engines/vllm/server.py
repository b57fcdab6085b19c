"""One vLLM OpenAI-compatible server (pipeline/engines/local_server.py ``LocalServer``): started with the python of
vLLM's own environment, its settings as command-line flags and environment, vLLM's error lines read from its log.

vLLM's server spawns an engine-core process and a worker of its own. A SIGKILLed server leaves them running, and
after a SIGKILLed job its SIGTERMed server stopped while its worker ran on; so it runs under the guard
(``guarded``: pipeline/engines/server_guard.py), which ends their whole process group, and ``close`` ends the group
too.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.engines.local_server import HOST, LocalServer, ServerError

SERVED_NAME = "speclab"
# a Python exception's last line ("ValueError: ..."); the API server's "see root cause above" names no cause
_EXCEPTION = re.compile(r"^(?:\(\w+ pid=\d+\) )?([\w.]*(?:Error|Exception): .*)$")
_VALUE_ERROR = re.compile(r"^Value error, (.*?)(?: \[type=.*)?$")  # what a pydantic ValidationError says was wrong
_NO_ROOM = re.compile(r"Available memory on node .* is less than requested memory for kv")
FIXES = Path(__file__).resolve().parent / "fixes"
_KV_CACHE = re.compile(r"KV cache|cache blocks", re.IGNORECASE)
_LOGGED_ERROR = re.compile(r"^(?:\(\w+ pid=\d+\) )?ERROR \S+ \S+ \[[^\]]+\] (.*)$")


@dataclass(frozen=True)
class VllmSpec:
    """What a server is started with: its python, model, speculative config and resources."""

    python: str
    model: str
    dtype: str = "auto"
    device: str = "cpu"
    speculative_config: str = ""            # JSON, empty: no speculation
    eager: bool = True
    max_model_len: int = 2048
    threads_bind: str = "auto"              # VLLM_CPU_OMP_THREADS_BIND
    kv_cache_gib: float = 1.0               # --kv-cache-memory-bytes (CPU); GPU: gpu_memory_utilization
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 8
    seed: int = 0
    max_logprobs: int = 20
    extra_args: tuple[str, ...] = ()
    port: int = 0
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 900.0
    cpu_expand_fix: bool = False            # engines/vllm/fixes/ on the server's PYTHONPATH

    def argv(self, port: int) -> list[str]:
        out = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
               "--seed", str(self.seed), "--max-logprobs", str(self.max_logprobs),
               "--enable-per-request-metrics", "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
        if self.eager:
            out.append("--enforce-eager")
        if self.device == "cpu":  # VLLM_CPU_KVCACHE_SPACE takes whole GiB only
            out += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30))]
        else:
            out += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.speculative_config:  # its per-request counters exist only under speculation
            out += ["--speculative-config", self.speculative_config, "--per-request-spec-decode-metrics", "detailed"]
        return [*out, *self.extra_args]

    def env(self) -> dict[str, str]:
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("PYTHONPATH", None)  # the server imports only its own environment's packages (and the fix, if asked)
        if self.cpu_expand_fix:
            env["PYTHONPATH"] = str(FIXES)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        if self.device == "cpu":
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.threads_bind)
        return env


class VllmServer(LocalServer):
    guarded = True

    def __init__(self, spec: VllmSpec, name: str = "vllm-server", log_dir: Path | None = None) -> None:
        super().__init__(name=name, log_dir=log_dir, port_wanted=spec.port, startup_timeout_s=spec.startup_timeout_s,
                         request_timeout_s=spec.request_timeout_s)
        self.spec = spec

    def argv(self, port: int) -> list[str]:
        return self.spec.argv(port)

    def env(self) -> dict[str, str]:
        return self.spec.env()

    def check_startable(self) -> None:
        python = Path(self.spec.python)
        if not python.exists() or not os.access(python, os.X_OK):
            raise ServerError(f"engine.python={self.spec.python!r} is not an executable python: run `make vllm` "
                              "(vLLM's own environment in the speclab cache) or give a python whose environment "
                              "has vLLM")

    def error_lines(self, lines: list[str]) -> list[str]:
        values = [m.group(1) for m in map(_VALUE_ERROR.match, lines) if m]
        found = [m.group(1) for m in map(_EXCEPTION.match, lines) if m and "root cause above" not in m.group(1)]
        logged = [m.group(1) for m in map(_LOGGED_ERROR.match, lines) if m]
        return values + found + logged

    def why(self, at_start: bool = True) -> str:
        """vLLM's reason, and for a KV cache that does not fit, the setting that sizes it."""
        text = super().why(at_start)
        if at_start and _NO_ROOM.search(text):
            return (f"the machine has too little free memory for engine.kv_cache_gib={self.spec.kv_cache_gib:g} GiB of "
                    f"KV cache: lower it or stop what else holds memory; vLLM said: {text}")
        if at_start and _KV_CACHE.search(text):
            return (f"the KV cache does not fit in engine.kv_cache_gib={self.spec.kv_cache_gib:g} GiB (CPU) or "
                    f"engine.gpu_memory_utilization={self.spec.gpu_memory_utilization:g} (GPU): raise it or lower "
                    f"engine.max_model_len={self.spec.max_model_len}; vLLM said: {text}")
        return text

    def completion(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.post("/v1/completions", {"model": SERVED_NAME, **payload})

    def metrics_text(self) -> str:
        return self.get_text("/metrics")


def spec_json(config: dict[str, Any] | None) -> str:
    return json.dumps(config, sort_keys=True) if config else ""
