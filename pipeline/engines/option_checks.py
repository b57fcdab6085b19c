"""What a job's engine can run, checked before anything loads: each refusal one line naming the value and what
is allowed there.

The engine declares it (pipeline/engines/base.py ``Engine``): the stage parts it runs (``stage_parts``; the
parts that step inside speclab's loop, distribution's draws and batch's padded rows, need that loop), and its own
refusals of options it cannot run (``Engine.check``, a classmethod: nothing is instantiated or started here). The
stage keys only one engine reads are declared on the schema's fields (``setting(..., engine=...)``) and refused here
for the others (``refuse_engine_keys``).
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import CONF_DIR, LLAMA_CPP, SPECLAB, STAGE_SCHEMAS, ConfigError, plain
from pipeline.config.settings import engine_keys
from pipeline.jobs.arms import engine_name, engine_type

LOOP_ONLY = {"distribution": "it draws the draft's proposals inside the loop",
             "batch": "it runs padded batches of prompts through the loop"}
# The stage keys one engine reads, as the schema declares them (``setting(..., engine=...)``): speclab's own arm
# flags (store/legacy_arms.py), the acceptance stage's extra configurations, its trees and tree timings and its
# near-tie threshold; llama.cpp's near-tie threshold. Under another engine each is refused, set off its default, where
# a part of the job reads it.
ENGINE_KEYS = {engine: engine_keys(STAGE_SCHEMAS.values(), engine) for engine in (SPECLAB, LLAMA_CPP)}
# stage=plan presets speclab's drafters and prefills (conf/stage/plan.yaml): another engine's plan settles them
PLAN_PRESETS = tuple(k for k in yaml.safe_load((CONF_DIR / "stage" / "plan.yaml").read_text())
                     if k in ENGINE_KEYS[SPECLAB])
# What a refusal says after ``stage.<key>=<value>`` (the others: the key configures speclab's own loop).
WHY = {
    "trees": "are speclab's token trees: llama.cpp drafts chains; leave stage.trees out under engine=llama_cpp",
    "prefill": "times speclab's prefill of the prompt: under engine=llama_cpp timing measures passes after a cached "
               "prompt only; leave stage.prefill=false",
    "tree_nodes": "times a tree's 4D-mask pass, which llama.cpp does not run: leave stage.tree_nodes out under "
                  "engine=llama_cpp",
    "tie_ulps": "counts units in the last place of speclab's torch logits: under engine=llama_cpp a near-tie is read "
                "from its top-2 log-probabilities: set stage.tie_nats instead",
    "tie_nats": "is read only under engine=llama_cpp (its divergences' top-2 log-probabilities); speclab's loop uses "
                "stage.tie_ulps: leave stage.tie_nats out",
}
SPECLAB_LOOP = ("configures speclab's own loop: under engine=llama_cpp leave it out; llama.cpp's configurations are "
                "engine.arms entries")


def check_engine(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what the job's engine cannot run (ConfigError, one line): a stage part it does not run, then what the
    engine itself refuses."""
    cls = engine_type(cfg)
    runs = cls.stage_parts
    for part in parts:
        if runs is not None and part not in runs:
            if part in LOOP_ONLY:
                raise ConfigError(f"stage part {part} needs speclab's own loop ({LOOP_ONLY[part]}): run stage="
                                  f"{cfg.stage.name} with engine=speclab; engine={engine_name(cfg)} runs {list(runs)}")
            raise ConfigError(f"stage part {part} is not run by engine={engine_name(cfg)}: it runs {list(runs)}")
    cls.check(cfg, parts)


def refuse_loop_groups(cfg: DictConfig, engine: str, arms_text: str) -> None:
    """An engine of requests refuses speclab's own drafter and k policy groups in one line: it keeps drafter=model and
    k_policy=fixed, and its configurations are ``stage.arms`` entries (``arms_text``: what its entries hold)."""
    from pipeline.config.stage_options import chosen
    for group, text in chosen(cfg).items():
        if group in ("drafter", "k_policy"):
            default = "drafter=model" if group == "drafter" else "k_policy=fixed"
            raise ConfigError(f"{text} is speclab's own {group.replace('_', ' ')}: under engine={engine} the job "
                              f"keeps {default} and its configurations are stage.arms entries ({arms_text})")


def check_request_entry(e, engine: str, arms_text: str, example: str, check_settings) -> None:
    """An arm entry an engine of requests runs: speculative (its drafter, ks, settings) or the plan's choice; never
    speclab's methods, k policies or trees; its settings checked by the engine's ``check_settings(drafter,
    settings)`` (a ValueError), each refusal one line naming the entry."""
    shown = e.given()
    if e.method not in ("speculative", "recommended"):
        raise ConfigError(f"stage.arms entry {shown}: method {e.method} is speclab's; under engine={engine} an entry "
                          f"is speculative ({arms_text}) or {{method: recommended}}")
    if e.k_policy is not None or e.tree is not None:
        key = "k_policy" if e.k_policy is not None else "tree"
        raise ConfigError(f"stage.arms entry {shown}: {key} is speclab's; {example}")
    try:
        check_settings(str(e.drafter or "model"), e.settings)
    except ValueError as err:
        raise ConfigError(f"stage.arms entry {shown}: {err}") from None


def _set(value) -> bool:
    """A flag a user set: not null, not false, not an empty list."""
    return value is not None and value is not False and value != []


def _default(stage: DictConfig, key: str) -> Any:
    """``key``'s default in the stage's schema (a stage option without one: the first stage schema declaring it)."""
    typ = OmegaConf.get_type(stage)
    schemas = [typ] if is_dataclass(typ) else []
    for schema in [*schemas, *STAGE_SCHEMAS.values()]:
        for f in fields(schema):
            if f.name == key:
                return f.default_factory() if callable(f.default_factory) else f.default
    return None


def refuse_engine_keys(cfg: DictConfig, parts: list[str], engine: str, skipped: tuple[str, ...] = ()) -> None:
    """Refuse a stage key only ``engine`` reads, set off its default where a part of the job reads it."""
    stage = cfg.stage
    for key in ENGINE_KEYS[engine]:
        if key not in stage or key in skipped or not any(key in STAGE_SCHEMAS[p].__dataclass_fields__
                                                         for p in parts if p in STAGE_SCHEMAS):
            continue
        value = plain(stage[key])
        if _set(value) and value != _default(stage, key):
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"stage.{key}={shown} {WHY.get(key, SPECLAB_LOOP)}")
