"""Run identity: a hash of the resolved config names a job's output, so a rerun can skip finished jobs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig

from pipeline.tracking import flatten

# Keys that do not change what a job measures.
VOLATILE = ("force", "mlflow.", "outputs_dir", "threads")


def config_hash(cfg: DictConfig) -> str:
    flat = {k: v for k, v in flatten(cfg).items() if not k.startswith(VOLATILE)}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def output_path(cfg: DictConfig, stage: str) -> Path:
    return Path(cfg.outputs_dir) / stage / f"{cfg.pair.name}-{config_hash(cfg)}.parquet"


def already_done(cfg: DictConfig, stage: str) -> Path | None:
    """The finished output of an identical job, unless ``force=true``."""
    path = output_path(cfg, stage)
    return path if path.exists() and not cfg.get("force", False) else None
