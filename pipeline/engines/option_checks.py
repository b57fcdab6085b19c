"""What a job's engine can run, checked before anything loads: each refusal one line naming the value and what
is allowed there.

The engine declares it (pipeline/engines/base.py ``Engine``): the stage parts it runs (``stage_parts``; the
parts that step inside speclab's loop, distribution's draws and batch's padded rows, need that loop), and its own
refusals of options it cannot run (``Engine.check``, a classmethod: nothing is instantiated or started here).
"""
from __future__ import annotations

from omegaconf import DictConfig

from pipeline.config.schema import ConfigError
from pipeline.engines.base import engine_conf_class
from pipeline.jobs.arms import engine_name

LOOP_ONLY = {"distribution": "it draws the draft's proposals inside the loop",
             "batch": "it runs padded batches of prompts through the loop"}


def check_engine(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what the job's engine cannot run (ConfigError, one line): a stage part it does not run, then what the
    engine itself refuses."""
    cls = engine_conf_class(cfg)
    runs = cls.stage_parts
    for part in parts:
        if runs is not None and part not in runs:
            if part in LOOP_ONLY:
                raise ConfigError(f"stage part {part} needs speclab's own loop ({LOOP_ONLY[part]}): run stage="
                                  f"{cfg.stage.name} with engine=speclab; engine={engine_name(cfg)} runs {list(runs)}")
            raise ConfigError(f"stage part {part} is not run by engine={engine_name(cfg)}: it runs {list(runs)}")
    cls.check(cfg, parts)
