"""Helpers shared by stages: sampling config, per-run identity columns, memory checks, and the
adjacent-runs design (arm order rotating by block, speed-ups over the block's plain run)."""
from __future__ import annotations

from typing import TypeVar

import pandas as pd
import torch
from omegaconf import DictConfig

from pipeline.context import StageContext
from pipeline.stages.options import uses
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


def run_name(cfg: DictConfig, part: str, settings: list[str] = (), extra: list[str] = ()) -> str:
    """Readable and distinct in MLflow's run table: the stage, its own ``settings`` (its k), the drafter and
    k policy where they are not the default ones, its ``extra`` arms, sampling, prompts, round and pair
    (the config hash is a tag). Options the stage does not read (pipeline/stages/options.py) are left out."""
    read = uses(part)
    bits = [part, *settings]
    bits += [str(cfg.drafter.name)] if cfg.drafter.name != "model" and "drafter" in read else []
    bits += [str(cfg.k_policy.name)] if cfg.k_policy.name != "fixed" and "k_policy" in read else []
    bits += extra
    s, p = cfg.sampling, cfg.prompts
    if s.do_sample and "sampling" in read:
        bits.append(f"T{s.temperature:g}" + (f" p{s.top_p:g}" if s.top_p < 1 else ""))
    bits.append("+".join(p.kinds) + (f"[{p.per_kind}]" if p.per_kind else "")
                + (f"[skip {p.skip_per_kind}]" if p.skip_per_kind else ""))
    bits.append(f"r{cfg.round}" + (f" rot{cfg.rotation}" if cfg.rotation else ""))
    bits.append(str(cfg.pair.name))
    return " ".join(bits)


def ks_label(ks: list[int]) -> str:
    return f"k{ks[0]}" if len(ks) == 1 else "k" + ",".join(map(str, ks))


def stage_ks(cfg: DictConfig, prefer: str = "ks") -> list[int]:
    """The k values of this job: ``stage.<prefer>``, else ``stage.ks``, else the top-level k."""
    ks = [int(k) for k in (cfg.stage.get(prefer) or cfg.stage.get("ks") or [cfg.k])]
    bad = [k for k in ks if k < 1]
    if bad:
        raise ValueError(f"k={bad[0]} is not allowed: the number of proposals must be an integer >= 1")
    return ks


T = TypeVar("T")


def rotated(arms: list[T], cfg: DictConfig, block: int) -> list[T]:
    """The arms in this block's order: rotated by the job's rotation, its round and the block, so slow
    drift of the machine cannot favour one arm systematically."""
    shift = (int(cfg.rotation) + int(cfg.round) + block) % len(arms)
    return arms[shift:] + arms[:shift]


def speedup_metrics(runs: pd.DataFrame, plain: pd.DataFrame) -> dict[str, float]:
    """The runs' median ratio to the adjacent plain run and its quartiles, and the median throughput of
    the runs and of the plain runs of the same blocks."""
    ratio = runs.ratio_to_adjacent_plain
    return {"speedup": ratio.median(), "speedup_q25": ratio.quantile(0.25), "speedup_q75": ratio.quantile(0.75),
            "spec_tokens_per_s": runs.tokens_per_s.median(),
            "plain_tokens_per_s": plain[plain.block.isin(runs.block)].tokens_per_s.median()}


def speedup_text(m: dict[str, float]) -> str:
    return f"speed-up {m['speedup']:.2f} (IQR {m['speedup_q25']:.2f}-{m['speedup_q75']:.2f})"


MEMORY_FIELDS = [("param_devices", "string"), ("rss_bytes", "int64"), ("device_free_bytes", "int64"),
                 ("memory_trusted", "bool"), ("memory_reason", "string")]
IDENTITY_FIELDS = [("pair", "string"), ("target", "string"), ("draft", "string"), ("device", "string"),
                   ("dtype", "string"), ("config_hash", "string")]
