"""llama.cpp's settings: how its servers start (binary, threads, context, ports, the draft file, more flags).
Same concept, other engines: every ``engines/<name>/conf.py``."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.engine_conf import EngineConf, ServerEngineConf
from pipeline.config.settings import same_as, setting
from pipeline.config.value_checks import MAX_THREADS, int_at_least, int_in


@dataclass
class LlamaCppEngineConf(ServerEngineConf):
    """llama.cpp's llama-server (engines/llama_cpp/): one server per configuration, on 127.0.0.1."""
    _target_: str = same_as(EngineConf, "_target_", "engines.llama_cpp.runner.LlamaRunner")
    name: str = same_as(EngineConf, "name", "llama_cpp")
    binary: str = setting("", doc="a llama-server executable; empty: the build of `make llama-cpp` (speclab cache)")
    threads: int = setting(2, int_in(1, MAX_THREADS, f"an integer >= 1 and <= {MAX_THREADS}"),
                           doc="the server's threads (-t and -tb)")
    ctx_size: int = setting(2048, int_at_least(64), doc="the server's context (-c): prompt + new tokens + drafts")
    cache_prompt: bool = setting(False, doc="false: every request prefills its prompt (as speclab's loop); true: "
                                            "the server reuses a cached common prefix")


CONF = LlamaCppEngineConf
