"""The arms a job runs: ``stage.arms``, each entry built by Hydra's ``instantiate`` into speclab's ``ArmEntry``, for
every stage and every engine (null: the engine's own default arms, ``Engine.default_arms``).
Same concept, other floors: each engine's ``engines/<name>/arms.py``, ``speclab/specs/arms.py``."""
from __future__ import annotations

import functools
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline.config.engine_conf import DEFAULT as DEFAULT_ENGINE, EngineConf
from pipeline.config.schema import CONF_DIR, ConfigError
from speclab.specs.arms import ArmEntry, check_keys, given_keys

ARM_ENTRY = f"{ArmEntry.__module__}.{ArmEntry.__qualname__}"


def engine_name(cfg: DictConfig) -> str:
    """The engine that runs the job's arms (``engine`` group; a config composed before it: speclab's loop)."""
    return str(OmegaConf.select(cfg, "engine.name", default=DEFAULT_ENGINE) or DEFAULT_ENGINE)


def engine_type(cfg: DictConfig) -> type:
    """The class of the job's engine, named by the config's ``engine._target_`` as Hydra instantiates it (the jobs
    import no engine: they ask the class what it declares)."""
    return get_class(str(OmegaConf.select(cfg, "engine._target_") or EngineConf._target_))


def engine_default_arms(cfg: DictConfig) -> list[dict[str, Any]]:
    """The arms the job's engine runs where ``stage.arms`` is null (its class's ``default_arms``)."""
    return [dict(a) for a in engine_type(cfg).default_arms]


@functools.lru_cache
def stage_preset(stage: str) -> Any:
    """The arms a stage's own conf file presets (conf/stage/<name>.yaml; None where it presets none), read once: every
    config hash asks (read-only: callers compare it)."""
    path = CONF_DIR / "stage" / f"{stage}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)).get("arms") if path.is_file() else None


def arm_list(cfg: DictConfig) -> list[dict[str, Any]]:
    """The job's arm entries as plain data: ``stage.arms``, or the engine's defaults where it is null. A stage file's
    preset (stage=plan's: speclab's drafters) stands for the engine's own defaults under another engine."""
    arms = OmegaConf.select(cfg, "stage.arms")
    plain = OmegaConf.to_container(arms, resolve=True) if arms is not None else None
    preset = engine_name(cfg) != DEFAULT_ENGINE and plain is not None and \
        [given_keys(e) for e in plain] == stage_preset(str(cfg.stage.name))
    if plain is None or preset:
        return engine_default_arms(cfg)
    return [given_keys(e) for e in plain]


def arm_entry(data: dict[str, Any]) -> ArmEntry:
    """One entry built by Hydra's ``instantiate``; a bad one is a ConfigError of one line."""
    try:
        check_keys(data)
        return instantiate({"_target_": ARM_ENTRY, **data}, _convert_="all")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ConfigError(f"stage.arms entry {data}: {cause}") from None


def stage_entries(cfg: DictConfig) -> list[ArmEntry]:
    """The job's arm entries; none for a stage without arms (timing, divergence, ...)."""
    if "arms" not in cfg.stage:
        return []
    return [arm_entry(e) for e in arm_list(cfg)]
