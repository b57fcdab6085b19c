"""speclab's loops as an engine: its settings (none besides what every engine declares; the loops' own are the
drafter, k_policy and stage groups).
Same concept, other engines: every ``engines/<name>/conf.py``."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.engine_conf import EngineConf


@dataclass
class SpeclabEngineConf(EngineConf):
    """speclab's own loops (the default): every stage, every drafter, policy and tree."""


CONF = SpeclabEngineConf
