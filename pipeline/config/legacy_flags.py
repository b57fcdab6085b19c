"""The keys from before ``stage.arms``, read where an old record's command is read: the speed stage's eight flags
(``stage.peer``, ``peer_modes``, ``k_policies``, ``drafters``, ``drafter_ks``, ``recommended``, ``best_fixed``, ``trees``;
store/legacy_arms.py ``FLAGS``) and the acceptance and plan stages' four keys (``drafters``, ``k_policies``,
``policy_drafters``, ``trees``; ``ACCEPTANCE_KEYS``). A recorded command that sets them reruns as the arm list they ran
(``translated``), so it composes to its recorded hash. They are no keys of the live schema: a new job writes
``stage.arms``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.overrides import hydra_value
from pipeline.config.schema import CONF_DIR, ConfigError
from store.extend import override_key
from store.legacy_arms import ACCEPTANCE_KEYS, FLAGS, PEER_MODES, RECORDED, dialect, effective_arms, merged_flags

FLAG_KEYS = tuple(f"stage.{k}" for k in {**FLAGS, **ACCEPTANCE_KEYS})
LEGACY_FLAGS_ENV = "SPECLAB_LEGACY_FLAGS"  # a command line's flags, for its jobs (also in launcher subprocesses)


def _value(override: str) -> Any:
    """A flag's value, checked as its schema checked it before stage.arms (the arms it makes are checked as arms)."""
    parsed = OverridesParser.create().parse_overrides([override])[0]
    key = override_key(override)
    flag = {**ACCEPTANCE_KEYS, **FLAGS}[key.split(".", 1)[1]]
    if parsed.is_sweep_override():
        raise ConfigError(f"{override} sweeps a flag from before stage.arms: sweep stage.arms instead "
                          "(docs/pipeline.md#arms)")
    value = parsed.value()
    if isinstance(flag, bool) and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not allowed: use true or false")
    if isinstance(flag, list) and not (isinstance(value, list) and all(isinstance(v, (str, int)) for v in value)):
        raise ConfigError(f"{key}={value!r} is not allowed: use a list")
    if key == "stage.peer_modes" and not set(value) <= set(PEER_MODES.values()):
        raise ConfigError(f"{key}={value!r} is not allowed: use a list drawn from {sorted(PEER_MODES.values())}")
    if key == "stage.drafter_ks" and not all(isinstance(v, int) and v >= 1 for v in value):
        raise ConfigError(f"{key}={value!r} is not allowed: use a list of integers >= 1")
    return value


def translated(overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> tuple[list[str], dict[str, Any]]:
    """``overrides`` with the flags the composed stage does not declare replaced by the ``stage.arms`` they ran, and
    every flag the stored job's hash is named by (store/legacy_arms.py ``merged_flags``, in the stage's dialect; none:
    ``overrides`` as they are). ``compose`` composes a job from overrides (Hydra's compose)."""
    flags = [o for o in overrides if override_key(o) in FLAG_KEYS]
    if not flags:
        return list(overrides), {}
    rest = [o for o in overrides if o not in flags]
    cfg = compose(rest)
    legacy = [o for o in flags if override_key(o).split(".", 1)[1] not in cfg.stage]
    if not legacy:
        return list(overrides), {}
    if "arms" not in cfg.stage:
        raise ConfigError(f"{legacy[0]} is a key of the arms from before stage.arms: stage {cfg.stage.name} runs no arms")
    stage = OmegaConf.to_container(cfg.stage, resolve=True)
    stage["arms"] = stage["arms"] if stage["arms"] is not None else [{}]  # the old keys were speclab's loop's: its own
    stage.update({override_key(o).split(".", 1)[1]: _value(o) for o in legacy})
    d = dialect(stage)
    unknown = [o for o in legacy if override_key(o).split(".", 1)[1] not in d.keys]
    if unknown:
        raise ConfigError(f"{override_key(unknown[0])} is not a key of stage {cfg.stage.name}'s arms from before "
                          f"stage.arms: use stage.arms (docs/pipeline.md#arms)")
    drafter, policy = str(cfg.drafter.name), str(cfg.k_policy.name)
    named = merged_flags(stage, drafter, policy)
    kept = [o for o in overrides if o not in legacy and override_key(o) != "stage.arms"]
    return [*kept, f"stage.arms={hydra_value(effective_arms(stage, drafter, policy))}"], named


def with_flags(cfg: DictConfig, flags: dict[str, Any]) -> DictConfig:
    """``cfg`` with the flags a recorded command's hash is named by beside its arms, under ``RECORDED`` (store/identity.py
    ``config_hash`` reads them as the stage's: the arms alone lose what did not change them, such as the peer modes of
    an arm list without peers)."""
    if flags:
        with open_dict(cfg):
            cfg[RECORDED] = flags
    return cfg


def compose_recorded(overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> DictConfig:
    """The job a recorded command composes to, its flags from before stage.arms run as the arms they ran."""
    given, flags = translated(overrides, compose)
    return with_flags(compose(given), flags)


def compose_job(overrides: list[str]) -> DictConfig:
    """A job's config composed from ``overrides`` with the repository's conf/ (no Hydra run)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def command_line(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """A command line's arguments with its flags from before stage.arms run as the arms they ran, said in one line,
    and the flags its jobs' hashes are named by (``with_flags``). Only the ``key=value`` overrides compose the stage;
    Hydra's own options and ``hydra.`` keys pass through."""
    overrides = [a for a in args if "=" in a and not a.startswith("-") and not override_key(a).startswith("hydra.")]
    if not any(override_key(o) in FLAG_KEYS for o in overrides):
        return list(args), {}
    new, flags = translated(overrides, compose_job)
    if not flags:
        return list(args), {}
    legacy = [o for o in overrides if o not in new]
    print(f"speclab: {' '.join(legacy)}: flags from before stage.arms, run as {new[-1]}", flush=True)
    return [a for a in args if a not in overrides] + new, flags
