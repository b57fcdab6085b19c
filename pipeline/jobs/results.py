"""Writing a stage's result: its rows as Parquet, with the provenance record that names the job."""
from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig

from pipeline.jobs.inputs import job_inputs
from pipeline.jobs.identity import config_hash
from pipeline.tracking.machine import describe
from pipeline.tracking.redact import redact_all
from speclab.models.loading import resolve_device
from store.records import write_parquet


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def hydra_overrides() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    return redact_all(list(HydraConfig.get().overrides.task)) if HydraConfig.initialized() else None


def provenance(cfg: DictConfig, part: str, started: str, git_commit: str, prompt_format: dict | None = None) -> dict:
    """The record a stage's Parquet carries: which job wrote it, from what, when; ``prompt_format``: how the
    prompts' contexts were made (the chat template resolved for this tokenizer, two-turn items' answers)."""
    return {"stage": part, "campaign": str(cfg.campaign), "config_hash": config_hash(cfg), "pair": str(cfg.pair.name),
            "git_commit": git_commit, "started_at": started, "finished_at": now(), "overrides": hydra_overrides(),
            "inputs": job_inputs(cfg), "machine": describe(str(resolve_device(str(cfg.device)))),
            **({"prompt_format": prompt_format} if prompt_format else {})}


def write_result(rows, schema, path: Path, meta: dict) -> Path:
    """Write a stage's Parquet; if the outputs disk fails now, keep the computed rows in the temp folder."""
    try:
        return write_parquet(rows, schema, path, meta)
    except OSError as err:
        rescue = Path(tempfile.gettempdir()) / "speclab-rescue" / path.parent.name / path.name
        write_parquet(rows, schema, rescue, meta)
        raise ValueError(f"could not write {path} ({err.strerror or type(err).__name__}); the results are safe "
                         f"in {rescue}: copy it there once the disk is fixed") from None
