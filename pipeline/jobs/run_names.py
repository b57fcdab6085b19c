"""What a person reads in MLflow's run table: a job's and an arm's run names (what varies first) and its metrics as
logged (headline names first, the rest prefixed ``x_``, the headline rounded for display)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pipeline.config.stage_options import uses
from pipeline.config.engine_conf import DEFAULT as DEFAULT_ENGINE
from pipeline.jobs.arms import engine_name
from pipeline.tracking.mlflow_view import prompt_source, rounded, swept_values


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
    read (pipeline/config/stage_options.py) are left out."""
    read = uses(part)
    varying = [*swept_values(cfg), *([engine_name(cfg)] if engine_name(cfg) != DEFAULT_ENGINE else []), *settings]
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
    bits = [arm, *([engine_name(cfg)] if engine_name(cfg) != DEFAULT_ENGINE else []), prompt_set(cfg), part,
            *([f"r{cfg.round}"] if cfg.round else []), str(cfg.pair.name)]
    return " · ".join(bits)


def ks_label(ks: list[int]) -> str:
    return f"k{ks[0]}" if len(ks) == 1 else "k" + ",".join(map(str, ks))


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
