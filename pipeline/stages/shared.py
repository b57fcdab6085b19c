"""Helpers shared by stages: per-run identity columns and row fields, and the
adjacent-runs design (arm order rotating by block, speed-ups over the block's plain run)."""
from __future__ import annotations

from typing import TypeVar

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline.engines.base import engine_of
from pipeline.jobs.context import StageContext
from speclab.stats.intervals import median_ci


def identity(ctx: StageContext) -> dict:
    """Columns every row carries so files from different runs can be pooled."""
    cfg, engine = ctx.cfg, engine_of(ctx)
    return {"pair": str(cfg.pair.name), "target": str(cfg.pair.target), "draft": engine.draft_name(cfg),
            "device": str(ctx.pair.device), "dtype": engine.weights(cfg), "config_hash": ctx.config_hash,
            "engine": str(engine.name)}


T = TypeVar("T")


def rotated(arms: list[T], cfg: DictConfig, block: int) -> list[T]:
    """The arms in this block's order: rotated by the job's rotation, its round and the block, so slow
    drift of the machine cannot favour one arm systematically."""
    shift = (int(cfg.rotation) + int(cfg.round) + block) % len(arms)
    return arms[shift:] + arms[:shift]


INTERVAL_NOTE = ("speedup_lo / speedup_hi: 95% distribution-free interval of the median ratio to the adjacent plain "
                 "run (order statistics, speclab.stats.intervals.median_ci), as the analysis computes it; none for an arm with "
                 "fewer runs than it needs (6 at 95%) or than trust.min_runs")


def min_runs(cfg: DictConfig) -> int:
    """The runs an interval needs (``trust.min_runs``)."""
    return int(OmegaConf.select(cfg, "trust.min_runs", default=3))


DEFAULT_LEVEL = 0.95  # the speed-up intervals' level where a stage does not set stage.interval_level


def speedup_metrics(runs: pd.DataFrame, plain: pd.DataFrame, needed: int = 3,
                    level: float = DEFAULT_LEVEL) -> dict[str, float]:
    """The runs' median ratio to the adjacent plain run, its interval at ``level`` (NaN with fewer than ``needed``
    runs or than the interval needs: no interval) and half its width (``precision``), its quartiles, the minutes
    the runs took, and the median throughput of the runs and of the plain runs of the same blocks."""
    ratio = runs.ratio_to_adjacent_plain
    lo, hi = median_ci(ratio.to_numpy(), level) if len(ratio) >= needed else (float("nan"), float("nan"))
    return {"speedup": ratio.median(), "speedup_lo": lo, "speedup_hi": hi, "runs": len(runs),
            "precision": (hi - lo) / 2, "level": level,
            "minutes": runs.wall_s.sum() / 60 if "wall_s" in runs else float("nan"),
            "speedup_q25": ratio.quantile(0.25), "speedup_q75": ratio.quantile(0.75),
            "spec_tokens_per_s": runs.tokens_per_s.median(),
            "plain_tokens_per_s": plain[plain.block.isin(runs.block)].tokens_per_s.median()}


def speedup_text(m: dict[str, float]) -> str:
    """The speed-up with its interval, or the number of runs when they are too few for one."""
    if m["speedup_lo"] != m["speedup_lo"]:
        return f"speed-up {m['speedup']:.2f} (n={int(m['runs'])}, no interval)"
    level = m.get("level", DEFAULT_LEVEL)
    return (f"speed-up {m['speedup']:.2f} ({level:.0%} CI {m['speedup_lo']:.2f}-{m['speedup_hi']:.2f}, "
            f"IQR {m['speedup_q25']:.2f}-{m['speedup_q75']:.2f}, n={int(m['runs'])})")


# The job-time checks' verdict (pipeline/jobs/trust.py), the same on every row of a job.
TRUST_FIELDS = [("trust", "string"), ("trust_detail", "string")]
MEMORY_FIELDS = [("param_devices", "string"), ("rss_bytes", "int64"), ("device_free_bytes", "int64"),
                 ("memory_trusted", "bool"), ("memory_reason", "string")]
# engine: which engine ran the rows (its ``Engine.name``); dtype: the weights as that engine ran them
# (``Engine.weights``: a torch dtype, a GGUF file's type).
IDENTITY_FIELDS = [("pair", "string"), ("target", "string"), ("draft", "string"), ("device", "string"),
                   ("dtype", "string"), ("config_hash", "string"), ("engine", "string")]
