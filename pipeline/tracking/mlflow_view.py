"""How MLflow shows speclab's runs: what run names say beyond the config (the prompt source actually used, what
a sweep varies), the experiment's kind, and headline metrics rounded for display.

All of it is display only: nothing here enters a config hash, a file's identity or a Parquet file.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from store.extend import override_key

SWEPT_ENV = "SPECLAB_SWEPT"  # the keys a multirun sweeps (space separated), for its jobs' run names
# Swept keys a run name already says in its own way (k3, r1, T0.7, the prompt source, the pair, the drafter...).
NAMED = ("k", "round", "rotation", "pair", "prompts", "prompts.file", "prompts.kinds", "prompts.per_kind",
         "prompts.skip_per_kind", "sampling", "drafter", "k_policy", "stage", "engine", "pair.draft_dtype")
# MLflow 3's experiment kind (the tag its UI reads to tell GenAI from classic ML experiments; MLflow's own
# values: genai_development, custom_model_development): speclab's runs are measurements, not traces.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# The experiment page's runs view (MLflow 3.x's UI chooses GenAI or Model training by this query, not by the tag).
RUNS_VIEW_QUERY = "?workflowType=machine_learning"
SHOWN_DIGITS = 3  # significant digits of a headline metric in MLflow (a view: the Parquet files keep every digit)


def rounded(value: float, digits: int = SHOWN_DIGITS) -> float:
    """``value`` to ``digits`` significant digits, never rounding its integer part (1234.5 -> 1234,
    0.07296 -> 0.073)."""
    if value != value or value in (float("inf"), float("-inf")) or value == 0:
        return value
    return round(value, max(0, digits - 1 - math.floor(math.log10(abs(value)))))


def _hydra():
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def prompt_source(cfg: DictConfig) -> str:
    """The prompts a job reads, as its run name says them: the prompt set chosen (``prompts=smoke``) unless the
    file was named on the command line, else the file's name without folder and suffix
    (``spec_bench/question.jsonl`` -> ``question``)."""
    hc = _hydra()
    if hc is not None:
        choice = hc.runtime.choices.get("prompts")
        if choice and not any(override_key(o) == "prompts.file" for o in hc.overrides.task):
            return str(choice)
    return Path(str(cfg.prompts.file)).stem


def swept_keys(task_overrides: list[str], sweeper_params: dict | None = None) -> list[str]:
    """The keys a multirun sweeps: its command line's sweep overrides (``k=2,4``, ``seed=range(3)``) and the
    sweep config's ``hydra.sweeper.params`` with more than one value, in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(
        [*task_overrides, *(f"{k}={v}" for k, v in (sweeper_params or {}).items())])
    keys = []
    for o in parsed:
        if o.is_sweep_override() and o.get_key_element().lstrip("+~") not in keys:
            keys.append(o.get_key_element().lstrip("+~"))
    return keys


def swept_values(cfg: DictConfig) -> list[str]:
    """In a multirun's job, ``key=value`` of each swept key its run name does not already say (``seed=2``)."""
    out = []
    for key in os.environ.get(SWEPT_ENV, "").split():
        if key in NAMED or key.split(".")[0] in ("hydra", "mlflow"):
            continue
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or isinstance(value, (DictConfig,)) or OmegaConf.is_list(value):
            hc = _hydra()  # a config group (its chosen option) or a list: as the job's override says it
            given = [o.split("=", 1)[1] for o in (hc.overrides.task if hc else []) if override_key(o) == key]
            value = given[0] if given else None
        if value is not None:
            out.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return out
