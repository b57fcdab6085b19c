"""Strategies from config: each drafter and k-policy option names its class in ``_target_``
(pipeline/config/schema.py) and Hydra's ``instantiate`` builds it, so no code here knows an option by
name. An extra arm (``stage.drafters``, ``stage.k_policies``, a plan's recommendation) names another
option than the job's; it takes that option's schema defaults."""
from __future__ import annotations

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import DRAFTERS, K_POLICIES
from speclab.decoding.drafters import Drafter
from speclab.drafting.strategy import PolicySpec, drafts_with_model


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


def make_drafter(conf: DictConfig, draft_model: torch.nn.Module) -> Drafter:
    """A new drafter of this option; the pair's draft model goes to a class whose constructor takes one."""
    model = {"model": draft_model} if drafts_with_model(get_class(conf._target_)) else {}
    return instantiate({key: value for key, value in conf.items() if key != "name"}, **model)


def policy_spec(conf: DictConfig) -> PolicySpec:
    return instantiate(conf)
