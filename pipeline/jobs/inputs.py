"""What a job reads besides its config, which must therefore name the job too.

A speed job's recommended arm follows the campaign's latest plan, a best_fixed arm runs the
exploratory check's best fixed configuration, and a published arm the pair's published best configurations; a cost-model arm the config does not spell out
(an arm entry naming it beside another ``k_policy``, or a plan's recommendation) takes its schema's
defaults. Were these left out of the job's hash, rerunning a check after a new plan, or after a
changed default, would find the old file "already complete" and report the old arms as the new.

A job resolves them once, as it starts (``freeze``), into ``cfg.inputs``: its hash, its MLflow params,
its provenance record and the stage itself then all see the same plan, even if another job writes a
newer one meanwhile. The rules for the latest plan and the best fixed configuration are the store's; the
cost-model keys that name such an arm are those its schema marks ``arm_hashed`` (pipeline/config/schema.py).
Same concept, other floor: ``analysis/inputs.py``.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.jobs.arms import arm_list, engine_name, stage_entries, stage_preset
from speclab.specs.arms import needs, policies as arm_policies
from store import best_fixed, layout, plans
from store.published_answer import published_entries
from store.legacy_arms import hashed_arms


def campaign_dir(cfg: DictConfig) -> Path:
    return layout.campaign_dir(cfg.outputs_dir, str(cfg.campaign))


def latest_plan_file(cfg: DictConfig) -> Path | None:
    """The plan file a recommended arm follows: the one the job froze at its start, or else this pair's
    plan in this campaign that finished last (``store.plans``)."""
    frozen = OmegaConf.select(cfg, "inputs.plan")
    if frozen is not None:
        return layout.stage_dir(cfg.outputs_dir, str(cfg.campaign), "plan") / f"{frozen}.parquet"
    return plans.latest_plan_file(cfg.outputs_dir, str(cfg.campaign), str(cfg.pair.name), engine_name(cfg))


def find_best_fixed(cfg: DictConfig) -> best_fixed.BestFixed | None:
    """The best fixed configuration of this pair's exploratory checks in this campaign, if any."""
    return best_fixed.find_best_fixed(cfg.outputs_dir, str(cfg.campaign), str(cfg.pair.name))


def published_configurations(cfg: DictConfig) -> list[dict]:
    """The entries a published arm runs: the pair's published best configurations, the job's frozen ones once it
    started (``pipeline.jobs.published``)."""
    frozen = OmegaConf.select(cfg, "inputs.published")
    if frozen is not None:
        return OmegaConf.to_container(frozen)
    return published_entries(cfg.outputs_dir, str(cfg.pair.name))


def _runs_schema_cost_model(cfg: DictConfig) -> bool:
    if str(cfg.k_policy.name) == "cost_model":
        return False  # its arms use the config's own k_policy, which is hashed
    entries = stage_entries(cfg)
    hashed = hashed_arms(engine_name(cfg), arm_list(cfg), stage_preset(str(cfg.stage.name))) if entries else []
    return "cost_model" in arm_policies(hashed) or needs(entries, "recommended")


def job_inputs(cfg: DictConfig) -> dict[str, object]:
    """The inputs above (nested, as ``cfg.inputs`` holds them), each left out where it does not apply, so
    jobs that read none keep their hash. A frozen job's own."""
    from pipeline.config.schema import COST_MODEL_ARM_KEYS, CostModelKConf

    if "inputs" in cfg:
        return OmegaConf.to_container(cfg.inputs)
    out: dict[str, object] = {}
    entries = stage_entries(cfg)
    if needs(entries, "recommended"):
        plan = latest_plan_file(cfg)
        out["plan"] = plan.stem if plan is not None else None
    if needs(entries, "best_fixed"):
        best = find_best_fixed(cfg)
        out["best_fixed"] = f"{best.drafter} k={best.k}" if best is not None else None
    if needs(entries, "published"):
        out["published"] = published_configurations(cfg)
    if _runs_schema_cost_model(cfg):
        arm = {key: value for key, neutral in COST_MODEL_ARM_KEYS.items()
               if (value := getattr(CostModelKConf, key)) != neutral}
        if arm:
            out["cost_model_arm"] = arm
    return out


def freeze(cfg: DictConfig) -> None:
    """Resolve the job's inputs now, into ``cfg.inputs`` (absent where there are none)."""
    inputs = job_inputs(cfg)
    if inputs and "inputs" not in cfg:
        with open_dict(cfg):
            cfg.inputs = inputs
