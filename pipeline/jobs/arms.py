"""The arm entries a job runs (``stage.arms``), as the speed stage, the job's inputs and its price tables read them.
Same concept, other floors: ``speclab/engines/llama_cpp/arms.py``, ``speclab/specs/arms.py``."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from speclab.specs.arms import ArmEntry, entry
from store.legacy_arms import effective_arms


def engine_name(cfg: DictConfig) -> str:
    """The engine that runs the job's arms (``engine`` group; a config composed before it: speclab's loop)."""
    return str(OmegaConf.select(cfg, "engine.name", default="speclab") or "speclab")


def stage_entries(cfg: DictConfig) -> list[ArmEntry]:
    """The job's arm entries; none for a stage without arms (acceptance, timing, ...)."""
    if "arms" not in cfg.stage:
        return []
    stage = OmegaConf.to_container(cfg.stage, resolve=True)
    # stage=all's acceptance keys (drafters, k_policies, trees) still add speed arms, as flags did before stage.arms
    return [entry(e) for e in effective_arms(stage, str(cfg.drafter.name), str(cfg.k_policy.name))]
