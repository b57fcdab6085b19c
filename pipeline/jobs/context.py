"""Shared set-up for every stage: threads, seeds, the model pair, the prompts and the strategies."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from pipeline.jobs.arms import stage_entries
from pipeline.jobs.identity import config_hash
from pipeline.prompts.sets import Prompt, load_prompts
from pipeline.config.strategy_config import drafter_conf, make_drafter, policy_conf, policy_spec
from pipeline.jobs.trust import LoadSampler
from pipeline.prompts.turns import PromptInputs, prompt_inputs
from speclab.specs.arms import policies as arm_policies
from speclab.models.loading import ModelPair, load_pair
from speclab.drafting.strategy import Strategy, make_strategy, measure_prices
from speclab.decoding.sampling import SamplingConfig
from speclab.decoding.timing import memory_placement
from speclab.costs.time_model import CostTable


@dataclass
class StageContext:
    cfg: DictConfig
    pair: ModelPair
    prompts: list[Prompt]
    inputs: dict[str, torch.Tensor]  # prompt id -> token ids on the pair's device (the context a run answers)
    config_hash: str
    _prices: CostTable | None = None
    prompt_record: dict[str, Any] = field(default_factory=dict)  # how the contexts were made (provenance)
    load: LoadSampler = field(default_factory=LoadSampler)  # the stage's load averages (pipeline/jobs/trust.py)
    runner: Any = None  # the engine that runs the requests (pipeline/engines/base.py Engine; None: speclab's loop)
    make_inputs: Callable[[list[Prompt]], PromptInputs] | None = None  # more prompts' contexts, as the first were made
    started: float = field(default_factory=time.monotonic)  # when the job began loading its models (pipeline.run)
    part_started: float | None = None  # when the running part began (pipeline/jobs/execute.py)
    said: set[str] = field(default_factory=set)  # lines a stage says once a job (a plan's growing sample comes back)

    def add_prompts(self, prompts: list[Prompt]) -> None:
        """Prompts joining the job after its start (a plan's growing sample): their contexts made and checked like the
        first ones', and the provenance record counting them."""
        if self.make_inputs is None:
            raise ValueError("this job's engine cannot add prompts after its start")
        made = self.make_inputs(prompts)
        self.inputs.update(made.ids)
        self.prompts = [*self.prompts, *prompts]
        rec = self.prompt_record
        rec["two_turn_prompts"] = int(rec.get("two_turn_prompts") or 0) + int(made.record["two_turn_prompts"])
        if rec.get("template_used") != made.record["template_used"]:
            rec["template_used"] = "mixed"
        if made.record.get("answers"):
            rec["answers"] = {**(rec.get("answers") or {}), **made.record["answers"]}
            rec["answers_dir"] = made.record["answers_dir"]

    def close(self) -> None:
        """Stop what the engine started (llama.cpp's servers); speclab's own loop holds nothing."""
        if self.runner is not None:
            self.runner.close()

    def compute_threads(self) -> int:
        """The threads the job's timed work runs on (its load check discounts them): another engine's server's
        (llama.cpp's ``threads``), else torch's."""
        own = getattr(self.runner, "compute_threads", None)  # the engine's (pipeline/engines/base.py)
        threads = own() if own is not None else None
        return int(threads) if threads else torch.get_num_threads()

    def prices(self, policy: str | None = None) -> CostTable | None:
        """The price table the k policy ``policy`` (None: the job's) reads, if it reads one: measured on
        the first prompt the first time a policy of the job needs it."""
        spec = policy_spec(policy_conf(self.cfg, policy))
        if spec.needs_prices and self._prices is None:
            self._prices = measure_prices(self.pair.target, self.pair.draft, self.inputs[self.prompts[0].id],
                                          int(spec.k_max))
        return self._prices if spec.needs_prices else None

    def strategy(self, k: int, drafter: str | None = None, policy: str | None = None) -> Strategy:
        """A new drafter and k policy (option names; None: the job's) for one run starting at ``k``."""
        return make_strategy(make_drafter(drafter_conf(self.cfg, drafter), self.pair.draft),
                             policy_spec(policy_conf(self.cfg, policy)), k, self.prices(policy))


def job_k_max(cfg: DictConfig) -> int:
    """The most proposals any iteration of this job can make (fixed ks and adaptive policies' k_max)."""
    st = cfg.stage
    entries = stage_entries(cfg)
    names = [cfg.k_policy.name, *arm_policies(entries)]
    policies = [policy_conf(cfg, str(p)) for p in dict.fromkeys(names)]
    return max([int(cfg.k), *(st.get("ks") or []), *(st.get("acceptance_ks") or []), *(k for e in entries for k in e.ks or []),
                *(int(p.k_max) for p in policies if "k_max" in p)])


def load_job_prompts(cfg: DictConfig) -> list[Prompt]:
    p = cfg.prompts
    return load_prompts(p.file, list(p.kinds), int(p.per_kind), int(p.skip_per_kind))


def set_threads(cfg: DictConfig) -> None:
    """torch's intra-op threads as the job asks (``threads``; 0 keeps torch's default): set before the job's
    runs are tagged, so their ``torch_threads`` is the number the job runs with."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))


def build_context(cfg: DictConfig, prompts: list[Prompt] | None = None) -> StageContext:
    """The job's engine (``engine`` group, built with ``instantiate``) loads what it runs and builds the prompts'
    contexts (pipeline/prompts/turns.py); every prompt is checked to fit before any stage computes."""
    from hydra.utils import instantiate

    prompts = prompts if prompts is not None else load_job_prompts(cfg)
    runner = instantiate(cfg.engine) if "engine" in cfg else None
    if runner is None:  # a config composed without the engine group: speclab's own loop
        return own_context(cfg, prompts)
    return runner.context(cfg, prompts)  # the engine seam (pipeline/engines/base.py Engine.context)


def own_context(cfg: DictConfig, prompts: list[Prompt] | None = None) -> StageContext:
    """speclab's own loop: load the pair (torch) and build the prompts' ids."""
    set_threads(cfg)
    torch.manual_seed(int(cfg.seed))
    prompts = prompts if prompts is not None else load_job_prompts(cfg)
    pair = load_pair(cfg.pair.target, cfg.pair.draft, cfg.device, cfg.pair.dtype, cfg.pair.draft_dtype or None)
    made = prompt_inputs(cfg, pair, prompts, job_k_max(cfg))
    return StageContext(cfg, pair, prompts, made.ids, config_hash(cfg), prompt_record=made.record,
                        make_inputs=lambda more: prompt_inputs(cfg, pair, more, job_k_max(cfg)))


def sampling_config(cfg: DictConfig) -> SamplingConfig:
    s = cfg.sampling
    return SamplingConfig(bool(s.do_sample), float(s.temperature), int(s.top_k), float(s.top_p))


def generator(ctx: StageContext, offset: int = 0) -> torch.Generator:
    return torch.Generator(device=ctx.pair.device).manual_seed(int(ctx.cfg.seed) + offset)


def memory_columns(ctx: StageContext) -> dict:
    m = memory_placement([ctx.pair.target, ctx.pair.draft], ctx.pair.device)
    return {"param_devices": m.param_devices, "rss_bytes": m.rss_bytes,
            "device_free_bytes": -1 if m.device_free_bytes is None else m.device_free_bytes,
            "memory_trusted": m.trusted, "memory_reason": m.reason}


def stage_ks(cfg: DictConfig, prefer: str = "ks") -> list[int]:
    """The k values of this job: ``stage.<prefer>``, else ``stage.ks``, else the top-level k."""
    ks = [int(k) for k in (cfg.stage.get(prefer) or cfg.stage.get("ks") or [cfg.k])]
    bad = [k for k in ks if k < 1]
    if bad:
        raise ValueError(f"k={bad[0]} is not allowed: the number of proposals must be an integer >= 1")
    return ks
