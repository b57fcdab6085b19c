"""speclab's own loop as an engine: the pair loaded in torch, every drafter, k policy and tree of ``stage.arms``.

The speed stage asks its engine for the arms, a run of one arm on one prompt, the step and pass times before
and after the runs, and the memory in use (pipeline/engines/llama_runner.py answers the same for llama.cpp).
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.jobs.context import StageContext
from pipeline.jobs.arms import stage_entries
from pipeline.jobs.inputs import find_best_fixed
from pipeline.jobs.context import memory_columns, sampling_config
from pipeline.engines.tree_drafter import job_tree_drafter
from speclab.specs.arms import Arm, Job, expand_all, needs
from speclab.decoding.loop import GenerationResult, plain_generate, speculative_generate
from speclab.measures.peer import hf_generate
from speclab.measures.step_costs import step_costs
from speclab.trees.tree_loop import tree_generate
from store.best_fixed import BestFixed

log = logging.getLogger(__name__)

# One-token step times taken in each block just before its runs (stage.block_timing_repeats > 0; NaN
# otherwise): the machine's state at the time of the runs, for a time model priced at that state.
BLOCK_STEP_FIELDS = ["block_target_step_s", "block_draft_step_s"]


def step_times(ctx: StageContext, ks: list[int], progress: str | None = None) -> tuple[float, float, dict[int, float]]:
    """Target step, draft step and the verification pass (k+1 new tokens) per k, on the first prompt."""
    st = ctx.cfg.stage
    ids = ctx.inputs[ctx.prompts[0].id]
    c = step_costs(ctx.pair.target, ctx.pair.draft, ids, ks, int(st.timing_repeats), int(st.timing_warmup), progress)
    return c.target_step_s, c.draft_step_s, c.verify_s


def block_step_times(ctx: StageContext, ids) -> dict[str, float]:
    """Target and draft one-token step after this prompt, timed now (median of the configured repeats)."""
    repeats = int(ctx.cfg.stage.block_timing_repeats)
    if not repeats:
        return dict.fromkeys(BLOCK_STEP_FIELDS, float("nan"))
    c = step_costs(ctx.pair.target, ctx.pair.draft, ids, [], repeats, warmup=1)
    return {"block_target_step_s": c.target_step_s, "block_draft_step_s": c.draft_step_s}


def by_depth(res: GenerationResult) -> tuple[str, str]:
    """Proposals checked and accepted at each depth 1, 2, ... of the iterations' chains or trees, as
    comma-separated counts: depth d was checked when the tree reached d and depths 1..d-1 were accepted."""
    deepest = max((i.k for i in res.iterations), default=0)
    checked = [sum(1 for i in res.iterations if i.k >= d and i.accepted >= d - 1) for d in range(1, deepest + 1)]
    accepted = [sum(1 for i in res.iterations if i.accepted >= d) for d in range(1, deepest + 1)]
    return ",".join(map(str, checked)), ",".join(map(str, accepted))


def widths(res: GenerationResult) -> tuple[str, str, int]:
    """The loop's iterations (a merged prefill's first one left out, as in the per-iteration times) as what a
    time model prices: the draft model's calls by width and the target's passes by width (``w:count,...``),
    and the tokens they produced. A chain's draft calls are its catch-up call and k - 1 one-token steps."""
    loop = [i for i in res.iterations if not i.with_prompt]
    calls = Counter(w for i in loop for w in (i.draft_widths or ([i.draft_fed] + [1] * (i.draft_calls - 1)
                                                                  if i.draft_calls else [])))
    passes = Counter(i.target_fed for i in loop)
    text = (lambda c: ",".join(f"{w}:{n}" for w, n in sorted(c.items())))
    return text(calls), text(passes), sum(i.new_tokens for i in loop)


def _breakdown(res: GenerationResult) -> dict[str, float]:
    """Counts over every iteration; times per loop iteration. A merged prefill's first iteration ran
    the prompt through both models: its time is the run's prefill (``prompt_s``), not a loop iteration's."""
    n = len(res.iterations)
    loop = [i for i in res.iterations if not i.with_prompt]
    if not n:
        return {"acceptance_rate": float("nan"), "tokens_per_pass": float("nan"), "iterations": 0, "mean_k": float("nan"),
                "merged_prefill": False, "tree_nodes": 0.0, "checked_by_depth": "", "accepted_by_depth": "",
                "draft_calls_by_width": "", "passes_by_width": "", "loop_new_tokens": 0,
                **{f"{p}_s_per_iter": float("nan") for p in ("draft", "verify", "rollback", "bookkeeping")}}
    per = (lambda part: sum(getattr(i, part) for i in loop) / len(loop)) if loop else (lambda part: float("nan"))
    checked, accepted = by_depth(res)
    calls, passes, loop_tokens = widths(res)
    return {"acceptance_rate": res.acceptance_rate, "tokens_per_pass": res.tokens_per_target_pass, "iterations": n,
            "mean_k": res.proposed / n, "merged_prefill": len(loop) < n,
            "tree_nodes": sum(i.tree_nodes for i in res.iterations) / n,
            "checked_by_depth": checked, "accepted_by_depth": accepted,
            "draft_calls_by_width": calls, "passes_by_width": passes, "loop_new_tokens": loop_tokens,
            **{f"{p}_s_per_iter": per(f"{p}_s") for p in ("draft", "verify", "rollback", "bookkeeping")}}


def prompt_s(res: GenerationResult) -> float:
    """Time on the prompt: the prefill apart, or a merged prefill's first iteration (which also drafted and
    checked its proposals)."""
    return res.prefill_s + sum(i.total_s for i in res.iterations if i.with_prompt)


def job_arms(ctx: StageContext, ks: list[int]) -> list[Arm]:
    """Plain, then the arms of each ``stage.arms`` entry (speclab.specs.arms), in order."""
    cfg = ctx.cfg
    entries = stage_entries(cfg)
    job = Job(str(cfg.drafter.name), str(cfg.k_policy.name), tuple(ks), int(cfg.k))
    best = None
    if needs(entries, "best_fixed"):  # the exploratory check's best, named now
        found = campaign_best_fixed(cfg)
        best = (found.drafter, found.k)
    return expand_all(entries, job, best)


def run_arm(ctx: StageContext, arm: Arm, ids, gen) -> tuple[list[int], float, float, dict]:
    pair = ctx.pair
    n_new, sampling = int(ctx.cfg.max_new_tokens), sampling_config(ctx.cfg)
    if arm.is_tree:
        r = tree_generate(pair.target, job_tree_drafter(ctx.cfg, arm.drafter, pair.draft), ids, n_new, sampling,
                          pair.eos_token_id, gen,
                          merge_prefill=bool(ctx.cfg.merge_prefill))
        return r.tokens, r.wall_s, prompt_s(r), _breakdown(r)
    if arm.ours:
        s = ctx.strategy(arm.k, arm.drafter, arm.k_policy)
        r = speculative_generate(pair.target, s.drafter, ids, n_new, k=s.policy, sampling=sampling,
                                 eos_token_id=pair.eos_token_id, generator=gen,
                                 merge_prefill=bool(ctx.cfg.merge_prefill))
        return r.tokens, r.wall_s, prompt_s(r), _breakdown(r)
    mode = arm.peer_mode
    if not mode:  # plain, or a plan that recommends not speculating
        r = plain_generate(pair.target, ids, n_new, sampling, pair.eos_token_id, gen)
        return r.tokens, r.wall_s, r.prefill_s, _breakdown(r)
    toks, wall = hf_generate(pair.target, ids, n_new, assistant=None if mode == "lookup" else pair.draft,
                             k=arm.k or 0, sampling=sampling, eos_token_id=pair.eos_token_id, mode=mode)
    return toks, wall, float("nan"), _breakdown(GenerationResult(toks, ids.shape[1], wall, float("nan")))


def campaign_best_fixed(cfg: DictConfig) -> BestFixed:
    """The best fixed configuration of this pair's exploratory checks in this campaign."""
    best, frozen = find_best_fixed(cfg), OmegaConf.select(cfg, "inputs.best_fixed")
    if best is not None and frozen is not None and frozen != f"{best.drafter} k={best.k}":
        raise ValueError(f"the best_fixed arm: the exploratory check's best changed from {frozen} to {best.drafter} "
                         f"k={best.k} since this job started (another job wrote speed results): rerun it")
    if best is None:
        raise ValueError(f"a best_fixed arm (stage.arms) needs an exploratory check of pair {cfg.pair.name} in campaign "
                         f"{cfg.campaign} (the recommended arm beside two or more fixed configurations): run "
                         f"`python -m pipeline.run +sweep=check_plan campaign={cfg.campaign}` first")
    log.info(f"speed: best fixed configuration of the exploratory check: {best.drafter} k={best.k} "
             f"(speed-up {best.speedup:.3f}, best of {best.configs} over {best.blocks} blocks)")
    return best



class SpeclabRunner:
    """The speed stage's questions, answered by speclab's loop."""

    name = "speclab"

    def __init__(self, name: str = "speclab", **_: Any) -> None:
        self.name = name

    def arms(self, ctx: StageContext, ks: list[int]) -> list[Arm]:
        return job_arms(ctx, ks)

    def warm_arms(self, arms: list[Arm]) -> list[Arm]:
        """Plain, the first speculative arm and every tree arm (a tree's passes take masks and widths no chain ran)."""
        return arms[:2] + [arm for arm in arms[2:] if arm.is_tree]

    def run(self, ctx: StageContext, arm: Arm, ids, gen):
        return run_arm(ctx, arm, ids, gen)

    def step_times(self, ctx: StageContext, ks: list[int], progress: str | None = None):
        return step_times(ctx, ks, progress)

    def block_step_times(self, ctx: StageContext, ids) -> dict[str, float]:
        return block_step_times(ctx, ids)

    def memory(self, ctx: StageContext) -> dict:
        return memory_columns(ctx)

    def weights(self, cfg: DictConfig) -> str:
        return str(cfg.pair.dtype)

    def close(self) -> None:
        pass
