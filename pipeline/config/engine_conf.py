"""An engine's settings: what every engine's schema declares (``EngineConf``: the runner it names and the name its
rows carry), and the engines found by name, each package's ``engines/<name>/conf.py`` ``CONF``, a subclass with the
engine's own settings (types, defaults, ranges), so adding an engine touches no file of the pipeline.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.settings import setting

ENGINES_DIR = Path(__file__).resolve().parents[2] / "engines"
DEFAULT = "speclab"  # the engine of a config composed without the engine group, and of rows written before it


@dataclass
class EngineConf:
    _target_: str = setting("engines.speclab.runner.SpeclabRunner", neutral="engines.speclab.runner.SpeclabRunner",
                            doc="the runner class (engines/<name>/runner.py), built by Hydra's instantiate")
    name: str = setting(DEFAULT, neutral=DEFAULT, doc="the engine that runs the arms (conf/engine/, engines/)")


def engine_confs() -> dict[str, type]:
    """Each engine package's settings schema by its name, speclab's loop first."""
    found = {}
    for path in sorted(ENGINES_DIR.glob("*/conf.py")):
        conf = importlib.import_module(f"engines.{path.parent.name}.conf").CONF
        found[conf().name] = conf
    return dict(sorted(found.items(), key=lambda item: item[0] != DEFAULT))
