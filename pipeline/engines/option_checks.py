"""What a job's engine can run, checked before anything loads: each refusal one line naming the value and what
is allowed there.

llama.cpp (engine=llama_cpp) answers requests: token ids, its own timings and counters, its top-n
probabilities. It runs the stages timing, acceptance, speed, divergence and plan; the stages that step inside
the loop (distribution's draws, batch's padded rows) and speclab's own drafters, k policies and trees need
speclab's loop. Its speculative configurations are ``engine.arms`` entries, not ``stage.arms``.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import CONF_DIR, LLAMA_CPP, SPECLAB, STAGE_SCHEMAS, ConfigError
from pipeline.config.settings import engine_keys
from pipeline.config.stage_options import chosen
from pipeline.jobs.arms import engine_name
from store.layout import STAGES

LLAMA = LLAMA_CPP
LOOP_ONLY = {"distribution": "it draws the draft's proposals inside the loop",
             "batch": "it runs padded batches of prompts through the loop"}
RUNS_ON_LLAMA = tuple(part for part in STAGES if part not in LOOP_ONLY)
DEFAULT_ARMS = [{"method": "speculative", "drafter": None, "k_policy": None, "ks": None, "tree": None}]
# The stage keys one engine reads, as the schema declares them (``setting(..., engine=...)``): speclab's own arm
# flags (store/legacy_arms.py), the acceptance stage's extra configurations, its trees and tree timings and its
# near-tie threshold; llama.cpp's near-tie threshold. Under another engine each is refused, set off its default, where
# a part of the job reads it (the plan's arm, {method: recommended} or the recommended flag, llama.cpp runs).
ENGINE_KEYS = {engine: engine_keys(STAGE_SCHEMAS.values(), engine) for engine in (SPECLAB, LLAMA)}
# stage=plan presets speclab's drafters and prefills (conf/stage/plan.yaml): its llama.cpp form settles them
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


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _refuse_keys(cfg: DictConfig, parts: list[str], engine: str, skipped: tuple[str, ...] = ()) -> None:
    """Refuse a stage key only ``engine`` reads, set off its default where a part of the job reads it."""
    stage = cfg.stage
    for key in ENGINE_KEYS[engine]:
        if key not in stage or key in skipped or not any(key in STAGE_SCHEMAS[p].__dataclass_fields__
                                                         for p in parts if p in STAGE_SCHEMAS):
            continue
        value = _plain(stage[key])
        if _set(value) and value != _default(stage, key):
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"stage.{key}={shown} {WHY.get(key, SPECLAB_LOOP)}")


def check_engine(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what the job's engine cannot run (ConfigError, one line)."""
    if engine_name(cfg) != LLAMA:
        _refuse_keys(cfg, parts, LLAMA)
        return
    for part in parts:
        if part in LOOP_ONLY:
            raise ConfigError(f"stage part {part} needs speclab's own loop ({LOOP_ONLY[part]}): run stage="
                              f"{cfg.stage.name} with engine=speclab; engine=llama_cpp runs {list(RUNS_ON_LLAMA)}")
    for group, text in chosen(cfg).items():
        if group in ("drafter", "k_policy"):
            default = "drafter=model" if group == "drafter" else "k_policy=fixed"
            raise ConfigError(f"{text} is speclab's own {group.replace('_', ' ')}: under engine=llama_cpp the job "
                              f"keeps {default} and llama.cpp's configurations are engine.arms entries "
                              "(drafter: model or an n-gram type, ks, settings)")
    stage = cfg.stage
    arms = OmegaConf.to_container(stage.arms, resolve=True) if "arms" in stage else []
    other = [a for a in arms if a != DEFAULT_ARMS[0] and a != {**DEFAULT_ARMS[0], "method": "recommended"}]
    if other:
        raise ConfigError(f"stage.arms entry {other[0]} is speclab's: llama.cpp's arms are engine.arms (e.g. "
                          "engine.arms=[{},{drafter:ngram-simple,default:true}]); under engine=llama_cpp stage.arms "
                          "takes only its default and {method:recommended}")
    _refuse_keys(cfg, parts, SPECLAB, PLAN_PRESETS if "plan" in parts else ())


def on_llama(ctx) -> bool:
    """Whether llama.cpp runs this job's requests (its stages then ask ``ctx.runner``, never the pair's models)."""
    from pipeline.engines.llama_runner import LlamaRunner
    return isinstance(ctx.runner, LlamaRunner)
