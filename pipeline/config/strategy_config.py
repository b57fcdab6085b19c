"""Strategies from config: each drafter and k-policy option names its class in ``_target_``
(pipeline/config/schema.py) and Hydra's ``instantiate`` builds it, so no code here knows an option by
name. An arm entry (``stage.arms``: its drafter, its k_policy; a plan's recommendation) names another
option than the job's; it takes that option's schema defaults. What the pipeline must know of a drafter (does it run
the draft model, look up n-grams, can the replay reproduce it) is asked of its class (speclab/decoding/drafters.py
Drafter), so a new drafter is its class and its option file, nothing else."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import DRAFTERS, K_POLICIES, options
from speclab.decoding.drafters import Drafter, declared
from speclab.drafting.strategy import PolicySpec, drafts_with_model
from speclab.specs.arms import declare_drafter
from speclab.specs.tree_shapes import is_tree


def drafter_conf(cfg: DictConfig, name: str | None = None) -> DictConfig:
    """The drafter option ``name`` (None: the job's). Another option keeps the job drafter's values of
    the keys both have (the n-gram sizes of prompt lookup and the hybrid)."""
    own = cfg.drafter
    if name is None or name == own.name:
        return own
    other = OmegaConf.structured(DRAFTERS[name])
    return OmegaConf.merge(other, {key: own[key] for key in other if key in own and key not in ("name", "_target_")})


def policy_conf(cfg: DictConfig, name: str | None = None) -> DictConfig:
    """The k-policy option ``name`` (None: the job's)."""
    own = cfg.k_policy
    return own if name is None or name == own.name else OmegaConf.structured(K_POLICIES[name])


def drafter_class(conf: DictConfig) -> type:
    """The class a drafter option names (its ``_target_``)."""
    return get_class(str(conf._target_))


def drafter_options(cfg: DictConfig) -> list[str]:
    """The drafter options a job's arms may name: conf/drafter/'s and the job's own (a user's option file found
    anywhere on Hydra's search path)."""
    return list(dict.fromkeys([*options("drafter", DRAFTERS), str(cfg.drafter.name)]))


def declare_drafters(cfg: DictConfig, names: Iterable[str]) -> None:
    """Each drafter option among ``names`` (the job's own and its arms'; an engine's own drafter names and trees are
    no options) says what its class declares (speclab.specs.arms.declare_drafter): whether it runs the draft model
    (its constructor takes one) and whether it looks up n-grams every iteration."""
    known = drafter_options(cfg)
    for name in dict.fromkeys([str(cfg.drafter.name), *map(str, names)]):
        if name not in known or is_tree(name):
            continue
        cls = drafter_class(drafter_conf(cfg, name))
        declare_drafter(name, drafts_with_model(cls), declared(cls, "looks_up"))


def make_drafter(conf: DictConfig, draft_model: torch.nn.Module) -> Drafter:
    """A new drafter of this option; the pair's draft model goes to a class whose constructor takes one."""
    model = {"model": draft_model} if drafts_with_model(drafter_class(conf)) else {}
    return instantiate({key: value for key, value in conf.items() if key != "name"}, **model)


def policy_spec(conf: DictConfig) -> PolicySpec:
    return instantiate(conf)
