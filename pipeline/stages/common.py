"""Helpers shared by stages: sampling config, per-run identity columns, memory checks."""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from pipeline.context import StageContext
from speclab.sampling import SamplingConfig
from speclab.timing import memory_placement


def sampling_config(cfg: DictConfig) -> SamplingConfig:
    s = cfg.sampling
    return SamplingConfig(bool(s.do_sample), float(s.temperature), int(s.top_k), float(s.top_p))


def generator(ctx: StageContext, offset: int = 0) -> torch.Generator:
    return torch.Generator(device=ctx.pair.device).manual_seed(int(ctx.cfg.seed) + offset)


def identity(ctx: StageContext) -> dict:
    """Columns every row carries so files from different runs can be pooled."""
    cfg = ctx.cfg
    return {"pair": str(cfg.pair.name), "target": str(cfg.pair.target), "draft": str(cfg.pair.draft),
            "device": str(ctx.pair.device), "dtype": str(cfg.pair.dtype), "config_hash": ctx.config_hash}


def memory_columns(ctx: StageContext) -> dict:
    m = memory_placement([ctx.pair.target, ctx.pair.draft], ctx.pair.device)
    return {"param_devices": m.param_devices, "rss_bytes": m.rss_bytes,
            "device_free_bytes": -1 if m.device_free_bytes is None else m.device_free_bytes,
            "memory_trusted": m.trusted, "memory_reason": m.reason}


def stage_ks(cfg: DictConfig, prefer: str = "ks") -> list[int]:
    """The k values of this job: ``stage.<prefer>``, else ``stage.ks``, else the top-level k."""
    ks = [int(k) for k in (cfg.stage.get(prefer) or cfg.stage.get("ks") or [cfg.k])]
    bad = [k for k in ks if k < 1]
    if bad:
        raise ValueError(f"k={bad[0]} is not allowed: the number of proposals must be an integer >= 1")
    return ks


MEMORY_FIELDS = [("param_devices", "string"), ("rss_bytes", "int64"), ("device_free_bytes", "int64"),
                 ("memory_trusted", "bool"), ("memory_reason", "string")]
IDENTITY_FIELDS = [("pair", "string"), ("target", "string"), ("draft", "string"), ("device", "string"),
                   ("dtype", "string"), ("config_hash", "string")]
