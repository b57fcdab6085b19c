"""Shared set-up for every stage: threads, seeds, the model pair and the prompts."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from pipeline.jobs import config_hash
from pipeline.prompts import Prompt, encode, load_prompts
from speclab.models import ModelPair, load_pair


@dataclass
class StageContext:
    cfg: DictConfig
    pair: ModelPair
    prompts: list[Prompt]
    inputs: dict[str, torch.Tensor]  # prompt id -> token ids on the pair's device
    config_hash: str
    _costs: tuple[float, dict[int, float]] | None = None

    def costs(self) -> tuple[float, dict[int, float]] | None:
        """Cost ratios for the cost-model k policy, measured once per job and only when it is used."""
        if self.cfg.k_policy.name != "cost_model" and "cost_model" not in (self.cfg.stage.get("k_policies") or []):
            return None
        if self._costs is None:
            from pipeline.strategies import measured_costs

            self._costs = measured_costs(self, int(self.cfg.k_policy.get("k_max", 10)))
        return self._costs


def build_context(cfg: DictConfig) -> StageContext:
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    prompts = load_prompts(cfg.prompts.file, list(cfg.prompts.kinds), int(cfg.prompts.per_kind))
    pair = load_pair(cfg.pair.target, cfg.pair.draft, cfg.device, cfg.pair.dtype)
    vocab = pair.target.config.vocab_size
    inputs = {p.id: encode(p, pair.tokenizer, vocab, pair.device) for p in prompts}
    return StageContext(cfg, pair, prompts, inputs, config_hash(cfg))
