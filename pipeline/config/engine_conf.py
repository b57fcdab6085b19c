"""An engine's settings: what every engine's schema declares (``EngineConf``: the runner it names and the name its
rows carry), and the engines found by name, each package's ``engines/<name>/conf.py`` ``CONF``, a subclass with the
engine's own settings (types, defaults, ranges), so adding an engine touches no file of the pipeline.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.settings import setting
from pipeline.config.value_checks import int_in, number_in

ENGINES_DIR = Path(__file__).resolve().parents[2] / "engines"
DEFAULT = "speclab"  # the engine of a config composed without the engine group, and of rows written before it


@dataclass
class EngineConf:
    _target_: str = setting("engines.speclab.runner.SpeclabRunner", neutral="engines.speclab.runner.SpeclabRunner",
                            doc="the runner class (engines/<name>/runner.py), built by Hydra's instantiate")
    name: str = setting(DEFAULT, neutral=DEFAULT, doc="the engine that runs the arms (conf/engine/, engines/)")


@dataclass
class ServerEngineConf(EngineConf):
    """What every engine that runs its configurations as local servers declares (llama.cpp, vLLM): where they listen,
    how long they may take to start, the draft model they run, more options for every server."""
    port: int = setting(0, int_in(0, 65535, "0 (a free port per server) or a port number <= 65535"),
                        doc="0: each server on a free port; N: servers on N, N+1, ...")
    startup_timeout_s: float = setting(180.0, number_in(0, float("inf"), lo_open=True),
                                       doc="wait this long for a server to answer its health check")
    draft_model: str = setting("", doc="the draft model in the engine's own form (llama.cpp: a GGUF model name or "
                                       ".gguf path; vLLM: a packaged model name or a Hugging Face-format folder); "
                                       "empty: the pair's draft where the engine runs it, else a copy of the target")
    extra_args: list[str] = setting([], doc="more server options, added to every server of the job")


def engine_confs() -> dict[str, type]:
    """Each engine package's settings schema by its name, speclab's loop first."""
    found = {}
    for path in sorted(ENGINES_DIR.glob("*/conf.py")):
        conf = importlib.import_module(f"engines.{path.parent.name}.conf").CONF
        found[conf().name] = conf
    return dict(sorted(found.items(), key=lambda item: item[0] != DEFAULT))
