"""Run identity and completeness: a hash of the resolved config names a job's output file.

A job is complete when its file reads, has the stage's schema and the rows its provenance record
says were written, and (with tracking on) MLflow holds a FINISHED run for the same job.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.job_inputs import campaign_dir, job_inputs
from pipeline.tracking import flatten

# Keys that do not change what a job measures. The campaign says where a result is filed,
# not what it measures: one measurement keeps one hash across campaigns. ``_target_`` keys name
# the class that builds an option (drafter, k policy) and are left out too.
VOLATILE = ("force", "mlflow.", "outputs_dir", "threads", "campaign")


# Keys added after results were stored, at the value that reproduces the old behaviour: left out of
# the hash, so a job that measures what it measured before keeps its identity (and its finished file).
HASH_NEUTRAL = {"stage.peer_modes": ["matched"], "stage.context_extra": [0], "stage.prefill": False,
                "stage.drafters": [], "stage.drafter_ks": [], "stage.recommended": False,
                "stage.k_policies": [], "prompts.skip_per_kind": 0,
                "k_policy.estimator": "iid", "stage.block_timing_repeats": 0,
                "stage.best_fixed": False, "stage.policy_drafters": [], "k_policy.condition_on": "none",
                "k_policy.free_k_min": None}
# Neutral only for these stages: the speed stage's k_policies existed (and was hashed) before.
NEUTRAL_ONLY_FOR = {"stage.k_policies": ("acceptance",)}


def _neutral(key: str, value: object, stage: str) -> bool:
    return key in HASH_NEUTRAL and value == HASH_NEUTRAL[key] and stage in NEUTRAL_ONLY_FOR.get(key, (stage,))


def config_hash(cfg: DictConfig) -> str:
    stage = str(cfg.stage.name)
    flat = {k: v for k, v in flatten(cfg).items()
            if not k.startswith(VOLATILE) and not _neutral(k, v, stage) and k.rsplit(".", 1)[-1] != "_target_"}
    if "inputs" not in cfg:  # not frozen by a job: resolve them now (pipeline/job_inputs.py)
        flat.update(flatten(OmegaConf.create({"inputs": job_inputs(cfg)})))
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def output_path(cfg: DictConfig, stage: str) -> Path:
    return campaign_dir(cfg) / stage / f"{cfg.pair.name}-{config_hash(cfg)}.parquet"


def run_identity(cfg: DictConfig, stage: str) -> dict[str, str]:
    """The tags that identify a job's MLflow run for one stage (its arms' child runs say level=arm)."""
    return {"stage": stage, "config_hash": config_hash(cfg), "campaign": str(cfg.campaign), "level": "stage"}
