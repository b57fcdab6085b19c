"""vLLM's settings: which environment runs it, how its servers start (eager or compiled, threads, KV cache, context,
ports, the draft folder, more flags). Each one is recorded with the job's provenance.
Same concept, other engines: every ``engines/<name>/conf.py``."""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.config.engine_conf import EngineConf, ServerEngineConf
from pipeline.config.settings import same_as, setting
from pipeline.config.value_checks import int_at_least, matches, number_in

# VLLM_CPU_OMP_THREADS_BIND: auto, all, nobind, or cores such as 0-1 / 0,1 / 0-3|4-7 (one list per rank)
THREADS_BIND = re.compile(r"^(auto|all|nobind|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*(\|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)*)$")


@dataclass
class VllmEngineConf(ServerEngineConf):
    """vLLM's OpenAI-compatible server (engines/vllm/): one server per configuration, on 127.0.0.1."""
    _target_: str = same_as(EngineConf, "_target_", "engines.vllm.runner.VllmRunner")
    name: str = same_as(EngineConf, "name", "vllm")
    python: str = setting("", doc="a python whose environment has vLLM; empty: the environment of `make vllm` "
                                  "(speclab cache; `make vllm-cuda` for device=cuda)")
    eager: bool = setting(True, doc="true: --enforce-eager (starts in 20-60 s here); false: vLLM compiles the model "
                                    "at every start (60-160 s here, and its compile cache failed to reload)")
    threads_bind: str = setting("auto", matches(THREADS_BIND, "auto, all, nobind or cores such as 0-1 or 0,1"),
                                doc="VLLM_CPU_OMP_THREADS_BIND: the cores vLLM's CPU worker binds its threads to")
    kv_cache_gib: float = setting(1.0, number_in(0, 1024, lo_open=True),
                                  doc="--kv-cache-memory-bytes in GiB: each server's KV cache (CPU)")
    gpu_memory_utilization: float = setting(0.5, number_in(0, 1, lo_open=True),
                                            doc="device=cuda: the share of GPU memory each server may take")
    max_model_len: int = setting(2048, int_at_least(64), doc="--max-model-len: prompt + new tokens + proposals")
    max_num_seqs: int = setting(8, int_at_least(1), doc="--max-num-seqs: the most requests a server batches")
    startup_timeout_s: float = same_as(ServerEngineConf, "startup_timeout_s", 300.0)
    cpu_expand_fix: bool = setting(False, neutral=False,
                                   doc="true: the servers run with engines/vllm/fixes/ (vllm-cpu 0.32.0's CPU expand "
                                       "kernel leaves speculative sampling's per-token temperatures uninitialised: "
                                       "docs/engines.md); false: vLLM as installed")


CONF = VllmEngineConf
