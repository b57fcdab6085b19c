"""Helpers shared by stages: sampling config, per-run identity columns, memory checks, and the
adjacent-runs design (arm order rotating by block, speed-ups over the block's plain run)."""
from __future__ import annotations

from typing import TypeVar

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from pipeline.context import StageContext
from pipeline.job_arms import engine_name
from pipeline.mlflow_view import prompt_source, rounded, swept_values
from pipeline.stages.options import uses
from speclab.sampling import SamplingConfig
from speclab.stats import median_ci
from speclab.timing import memory_placement


def sampling_config(cfg: DictConfig) -> SamplingConfig:
    s = cfg.sampling
    return SamplingConfig(bool(s.do_sample), float(s.temperature), int(s.top_k), float(s.top_p))


def generator(ctx: StageContext, offset: int = 0) -> torch.Generator:
    return torch.Generator(device=ctx.pair.device).manual_seed(int(ctx.cfg.seed) + offset)


def identity(ctx: StageContext) -> dict:
    """Columns every row carries so files from different runs can be pooled."""
    cfg, runner = ctx.cfg, ctx.runner
    own = runner is None or runner.name == "speclab"
    return {"pair": str(cfg.pair.name), "target": str(cfg.pair.target),
            "draft": str(cfg.pair.draft) if own else runner.draft_label, "device": str(ctx.pair.device),
            "dtype": str(cfg.pair.dtype) if own else runner.weights(cfg), "config_hash": ctx.config_hash,
            "engine": "speclab" if own else runner.name}


def memory_columns(ctx: StageContext) -> dict:
    m = memory_placement([ctx.pair.target, ctx.pair.draft], ctx.pair.device)
    return {"param_devices": m.param_devices, "rss_bytes": m.rss_bytes,
            "device_free_bytes": -1 if m.device_free_bytes is None else m.device_free_bytes,
            "memory_trusted": m.trusted, "memory_reason": m.reason}


NAME_MAX = 60  # MLflow's run table cuts names short: what varies comes first
KINDS_MAX = 24  # longer lists of prompt kinds are named by their number (the kinds are the tag ``prompts``)


def prompt_set(cfg: DictConfig) -> str:
    """The prompts a job reads, as run names and the ``prompt_set`` tag say them: the prompt set chosen
    (``prompts=smoke``), else the file's name without folder (``question`` for spec_bench/question.jsonl)."""
    return prompt_source(cfg)


def shorten(name: str, limit: int = NAME_MAX) -> str:
    return name if len(name) <= limit else name[:limit - 1].rstrip(" ·") + "…"


def run_name(cfg: DictConfig, part: str, settings: list[str] = (), extra: list[str] = ()) -> str:
    """Readable and distinct in MLflow's run table, what varies first: in a multirun, the swept overrides the name
    does not otherwise say (``seed=2``); the engine where it is not speclab's loop,
    the stage's own ``settings`` (its k),
    the drafter and k policy where they are not the default ones, its ``extra`` arms, sampling, the draft's
    dtype where the pair's name does not say it, the round; then the prompt kinds (their number when the list is
    long), the prompt set, the stage
    and the pair (the config hash is a tag), at most ``NAME_MAX`` characters. Options the stage does not
    read (pipeline/stages/options.py) are left out."""
    read = uses(part)
    varying = [*swept_values(cfg), *([engine_name(cfg)] if engine_name(cfg) != "speclab" else []), *settings]
    varying += [str(cfg.drafter.name)] if cfg.drafter.name != "model" and "drafter" in read else []
    varying += [str(cfg.k_policy.name)] if cfg.k_policy.name != "fixed" and "k_policy" in read else []
    varying += extra
    s, p = cfg.sampling, cfg.prompts
    if s.do_sample and "sampling" in read:
        varying.append(f"T{s.temperature:g}" + (f" p{s.top_p:g}" if s.top_p < 1 else ""))
    draft_dtype = str(OmegaConf.select(cfg, "pair.draft_dtype", default="") or "")
    if draft_dtype and draft_dtype not in str(cfg.pair.name):
        varying.append(f"draft={draft_dtype}")
    if cfg.round or cfg.rotation:
        varying.append(f"r{cfg.round}" + (f" rot{cfg.rotation}" if cfg.rotation else ""))
    kinds = "+".join(p.kinds)
    kinds = ((kinds if len(kinds) <= KINDS_MAX else f"{len(p.kinds)} kinds") + (f"[{p.per_kind}]" if p.per_kind else "")
             + (f"[skip {p.skip_per_kind}]" if p.skip_per_kind else ""))
    bits = [" ".join(varying), kinds, prompt_set(cfg), part, str(cfg.pair.name)]
    return shorten(" · ".join(b for b in bits if b))


def arm_run_name(cfg: DictConfig, part: str, arm: str) -> str:
    """An arm's run: the arm (its k, policy, drafter and kind) first, then the prompt set, stage, round and pair."""
    bits = [arm, *([engine_name(cfg)] if engine_name(cfg) != "speclab" else []), prompt_set(cfg), part,
            *([f"r{cfg.round}"] if cfg.round else []), str(cfg.pair.name)]
    return " · ".join(bits)



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


# What a run with speed-ups shows first (MLflow lists metrics by name: these, then ``trusted``, are the first seven
# rows of its compare view's metric box and of its column picker): the rest, the interval's level and half-width
# and the minutes included, is logged as x_<name>.
HEADLINE_METRICS = ("speedup", "speedup_lo", "speedup_hi", "runs", "alpha", "tokens_per_pass")
GROUPED_STAGES = ("speed", "batch")
DETAIL_PREFIX = "x_"


def grouped_metrics(metrics: dict[str, float], part: str) -> dict[str, float]:
    """A ``part`` run's metrics as logged: for speed and batch the headline names first and every other name
    prefixed ``x_`` (listed after them); other stages' as they are."""
    if part not in GROUPED_STAGES:
        return dict(metrics)
    return {**{k: metrics[k] for k in HEADLINE_METRICS if k in metrics},
            **{f"{DETAIL_PREFIX}{k}": v for k, v in metrics.items() if k not in HEADLINE_METRICS}}


def shown_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics as MLflow shows them: the headline names (``HEADLINE_METRICS``) rounded (``rounded``), the rest exact."""
    return {k: rounded(float(v)) if k in HEADLINE_METRICS and v is not None else v for k, v in metrics.items()}


INTERVAL_NOTE = ("speedup_lo / speedup_hi: 95% distribution-free interval of the median ratio to the adjacent plain "
                 "run (order statistics, speclab.stats.median_ci), as the analysis computes it; none for an arm with "
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


# The job-time checks' verdict (pipeline/trust.py), the same on every row of a job.
TRUST_FIELDS = [("trust", "string"), ("trust_detail", "string")]
MEMORY_FIELDS = [("param_devices", "string"), ("rss_bytes", "int64"), ("device_free_bytes", "int64"),
                 ("memory_trusted", "bool"), ("memory_reason", "string")]
# engine: which engine ran the rows (speclab's loop, llama_cpp); dtype: the weights as that engine ran them (a
# torch dtype, or llama.cpp's ``gguf:<type>``).
IDENTITY_FIELDS = [("pair", "string"), ("target", "string"), ("draft", "string"), ("device", "string"),
                   ("dtype", "string"), ("config_hash", "string"), ("engine", "string")]
