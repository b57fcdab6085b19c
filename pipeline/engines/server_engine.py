"""What the engines that answer requests from local servers share (llama.cpp's and vLLM's runners): the arms a job
compares from its entries (each engine's ``expand``), the plan's choice run last, a request's seed, the speed stage's
run (a plan that chose not to speculate: the plain server answers), the tokens that follow a prompt (what its passes
are timed on), the servers' memory and their stop. Each engine keeps what differs: its context, its requests, its
passes and its refusals."""
from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from pipeline.engines.base import Engine, RunResult, StepTimes, TimedPass, loop_columns
from speclab.measures.step_costs import pass_timing
from speclab.specs.arms import NONE, PLAIN, RECOMMENDED, Arm, ArmEntry

EXTENSION_TOKENS = 16  # the tokens a timed pass may add after the prompt (k + 1 <= 16)


class ServerEngine(Engine):
    """An engine whose ``engine`` (its client) holds one server per configuration: ``generate(arm, ids, n)``,
    ``server_pids()``, ``close()``."""

    engine: Any = None
    draft_label: str = ""
    _weights: str = ""

    def __init__(self) -> None:
        self.engine = None
        self._extension: dict[str, list[int]] = {}

    @classmethod
    def expand(cls, entries: list[ArmEntry], ks: list[int]) -> list[Arm]:
        """Plain, then the engine's arms of these entries."""
        raise NotImplementedError

    def request_context(self, cfg: DictConfig, prompts, pair, limit: int, vocab: int | None, record: dict):
        """The job's context once the engine's servers are set up: the prompts as the target's token ids (multi-turn
        prompts answered by the plain server), ``limit`` the most tokens a prompt may reach, ``record`` the engine's
        settings in the job's provenance."""
        from pipeline.jobs.context import StageContext
        from pipeline.jobs.identity import config_hash
        from pipeline.prompts.turns import PromptModels, prompt_inputs

        n_new = int(cfg.max_new_tokens)
        models = PromptModels(pair.tokenizer, torch.device("cpu"), vocab, {"target": limit, "draft": limit}, {},
                              lambda c: self.engine.generate(PLAIN, c[0].tolist(), n_new).tokens, self._weights)
        made = prompt_inputs(cfg, None, prompts, self.k_max(cfg), models)
        ctx = StageContext(cfg, pair, prompts, made.ids, config_hash(cfg), prompt_record=made.record, runner=self,
                           make_inputs=lambda more: prompt_inputs(cfg, None, more, self.k_max(cfg), models))
        ctx.prompt_record["engine"] = record
        return ctx

    def k_max(self, cfg: DictConfig) -> int:
        from pipeline.jobs.arms import stage_entries
        from pipeline.jobs.context import stage_ks
        ks = stage_ks(cfg)
        return max([int(cfg.k), *ks, *(a.k or 0 for a in self.expand(stage_entries(cfg), ks))])

    def weights(self, cfg: DictConfig) -> str:
        return self._weights

    def draft_name(self, cfg: DictConfig) -> str:
        return self.draft_label

    def arms(self, ctx, ks: list[int]) -> list[Arm]:
        """``stage.arms`` (null: ``default_arms``), the plan's choice last where an entry asks for it."""
        from pipeline.jobs.arms import stage_entries
        arms = self.expand(stage_entries(ctx.cfg), ks)
        return [a for a in arms if a != RECOMMENDED] + [a for a in arms if a == RECOMMENDED]

    @staticmethod
    def payload(do_sample: bool, temperature: float, top_k: int, top_p: float, seed: int) -> dict[str, Any]:
        """The engine's sampler settings for speclab's sampling config (its client's ``sampling_payload``)."""
        raise NotImplementedError

    @staticmethod
    def seed(cfg: DictConfig, gen: torch.Generator | None) -> int:
        """A sampled request's seed, drawn from the job's generator (0 for greedy)."""
        return int(torch.randint(0, 2**31 - 1, (1,), generator=gen)) if gen is not None and cfg.sampling.do_sample else 0

    def sampling(self, cfg: DictConfig, gen: torch.Generator | None) -> dict[str, Any]:
        """A request's sampler settings: the job's sampling group, seeded from its generator."""
        s = cfg.sampling
        return self.payload(bool(s.do_sample), float(s.temperature), int(s.top_k), float(s.top_p), self.seed(cfg, gen))

    def run(self, ctx, arm: Arm, ids: torch.Tensor, gen) -> RunResult:
        if arm.drafter == NONE and arm.method != "plain":
            arm = PLAIN  # a plan that recommends not speculating: the plain server answers
        r = self.request(ctx, arm, ids, gen)
        return RunResult(r.tokens, r.wall_s, r.prompt_s, loop_columns(r, arm.method != "plain"))

    def extension(self, ctx, ids: torch.Tensor, key: str, n: int = EXTENSION_TOKENS) -> list[int]:
        """``n`` tokens that follow the prompt (the plain greedy answer, padded with the prompt's own tokens)."""
        if key not in self._extension or len(self._extension[key]) < n:
            toks = self.engine.generate(PLAIN, ids[0].tolist(), n).tokens
            pad = ids[0].tolist()
            self._extension[key] = (toks + pad * (n // max(len(pad), 1) + 1))[:n]
        return self._extension[key][:n]

    # -- its passes ----------------------------------------------------------------------------------------------------
    def context_limit(self) -> tuple[int, str]:
        """The most tokens a timed pass may reach (prompt, extra context and pass), and how to raise it."""
        raise NotImplementedError

    def timed_passes(self, ids: list[int], extension: list[int], lengths: list[int], repeats: int, warmup: int,
                     role: str) -> tuple[int, dict[int, list[float]]]:
        """The context the engine timed its passes after (its length) and the seconds of each pass length."""
        raise NotImplementedError

    def time_passes(self, ctx, prompt_id: str, ids: torch.Tensor) -> list[TimedPass]:
        """The target's and the draft's pass over m new tokens after the prompt (plus ``context_extra`` more tokens),
        each timed as the engine's server runs it (``timed_passes``)."""
        st = ctx.cfg.stage
        lengths, extras = [int(n) for n in st.pass_lengths], [int(e) for e in st.context_extra]
        limit, what = self.context_limit()
        n = ids.shape[1]
        if n + max(extras) + max(lengths) > limit:
            raise ValueError(f"stage.context_extra={max(extras)} with pass_lengths up to {max(lengths)} after prompt "
                             f"{prompt_id} ({n} tokens) exceeds {what} of {limit} tokens: raise it or lower "
                             "stage.context_extra")
        ext = self.extension(ctx, ids, prompt_id, max(extras) + max(lengths))
        out = []
        for role in ("target", "draft"):
            mem = self.memory(ctx)
            for e in extras:
                context_len, times = self.timed_passes(ids[0].tolist() + ext[:e], ext[e:], lengths, int(st.repeats),
                                                       int(st.warmup), role)
                out += [TimedPass(context_len, role, pass_timing(m, times[m]), mem) for m in lengths]
        return out

    def step_times(self, ctx, ks: list[int], progress: str | None = None) -> StepTimes:
        st = ctx.cfg.stage
        p = ctx.prompts[0].id
        ids = ctx.inputs[p]
        return StepTimes(*self.engine.step_costs(ids[0].tolist(), self.extension(ctx, ids, p),
                                                 [k for k in ks if k < EXTENSION_TOKENS],
                                                 int(st.timing_repeats), int(st.timing_warmup)))

    def device_of(self, ctx) -> str:
        """Where the servers hold the weights (the rows' ``param_devices``)."""
        return "cpu"

    def memory(self, ctx) -> dict:
        """The servers' resident memory, every process of theirs summed."""
        import psutil
        rss = 0
        for pid in self.engine.server_pids() if self.engine else []:
            try:
                rss += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return {"param_devices": self.device_of(ctx), "rss_bytes": rss, "device_free_bytes": -1,
                "memory_trusted": True, "memory_reason": ""}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
