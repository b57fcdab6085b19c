"""Run identity for a Hydra job: its config as plain data, named by the store's config hash.

A job is complete when its file reads, has the stage's schema and the rows its provenance record
says were written, and (with tracking on) MLflow holds a FINISHED run for the same job.
Same concept, other floor: ``store/identity.py``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import HASH_NEUTRAL, VOLATILE
from pipeline.jobs.arms import arm_list, engine_default_arms, stage_preset
from pipeline.jobs.inputs import campaign_dir, job_inputs  # noqa: F401 - campaign_dir: the run's too
from store import identity, layout


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data (Hydra's own section left out), the stage's arms as the job runs them (null:
    the engine's defaults)."""
    out = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"}
    if "arms" in cfg.stage:
        out["stage"]["arms"] = arm_list(cfg)
    return out


def run_params(cfg: DictConfig) -> dict[str, Any]:
    """What a job measures, as MLflow params (where and how it ran left out)."""
    return identity.measured(identity.flatten(plain_config(cfg)), VOLATILE)


def config_hash(cfg: DictConfig) -> str:
    """``store.identity.config_hash`` of the job; inputs the job has not frozen yet are resolved now."""
    inputs = None if "inputs" in cfg else job_inputs(cfg)
    return identity.config_hash(plain_config(cfg), inputs, neutral=HASH_NEUTRAL, volatile=VOLATILE,
                                engine_arms=engine_default_arms(cfg), stage_preset=stage_preset(str(cfg.stage.name)))


def output_path(cfg: DictConfig, stage: str) -> Path:
    return layout.stage_file(cfg.outputs_dir, str(cfg.campaign), stage, str(cfg.pair.name), config_hash(cfg))


def run_identity(cfg: DictConfig, stage: str) -> dict[str, str]:
    """The tags that identify a job's MLflow run for one stage (its arms' child runs say level=arm)."""
    return {"stage": stage, "config_hash": config_hash(cfg), "campaign": str(cfg.campaign), "level": "stage"}

