"""Shared set-up for every stage: threads, seeds, the model pair and the prompts."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from pipeline.jobs import config_hash
from pipeline.prompts import Prompt, check_fits, context_limit, encode, load_prompts
from speclab.models import ModelPair, load_pair
from speclab.time_model import CostTable  # noqa: F401 - in annotations


@dataclass
class StageContext:
    cfg: DictConfig
    pair: ModelPair
    prompts: list[Prompt]
    inputs: dict[str, torch.Tensor]  # prompt id -> token ids on the pair's device
    config_hash: str
    _costs: "CostTable | None" = None

    def costs(self, needed: bool = False) -> "CostTable | None":
        """The cost-model k policy's price table, measured once per job and only when it is used
        (``needed``: a plan's recommendation uses the policy although the config does not name it)."""
        used = self.cfg.k_policy.name == "cost_model" or "cost_model" in (self.cfg.stage.get("k_policies") or [])
        if self._costs is None and (used or needed):
            from pipeline.strategies import measured_costs

            self._costs = measured_costs(self, int(self.cfg.k_policy.get("k_max", 10)))
        return self._costs


def job_k_max(cfg: DictConfig) -> int:
    """The most proposals any iteration of this job can make (fixed ks and adaptive policies' k_max)."""
    st, pol = cfg.stage, cfg.k_policy
    ks = [int(cfg.k), *(st.get("ks") or []), *(st.get("acceptance_ks") or [])]
    if pol.name != "fixed" or st.get("k_policies"):
        ks.append(int(pol.get("k_max", 10)))
    return max(ks)


def load_job_prompts(cfg: DictConfig) -> list[Prompt]:
    return load_prompts(cfg.prompts.file, list(cfg.prompts.kinds), int(cfg.prompts.per_kind),
                        int(cfg.prompts.get("skip_per_kind", 0)))


def build_context(cfg: DictConfig, prompts: list[Prompt] | None = None) -> StageContext:
    """Load the pair and encode the prompts; every prompt is checked to fit before any stage computes."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    prompts = prompts if prompts is not None else load_job_prompts(cfg)
    pair = load_pair(cfg.pair.target, cfg.pair.draft, cfg.device, cfg.pair.dtype)
    vocab = pair.target.config.vocab_size
    inputs = {p.id: encode(p, pair.tokenizer, vocab, pair.device) for p in prompts}
    limits = {"target": context_limit(pair.target), "draft": context_limit(pair.draft)}
    for p in prompts:
        check_fits(p.id, inputs[p.id].shape[1], int(cfg.max_new_tokens), job_k_max(cfg), limits)
    return StageContext(cfg, pair, prompts, inputs, config_hash(cfg))
