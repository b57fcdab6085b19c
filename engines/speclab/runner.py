"""speclab's own loop as an engine: the pair loaded in torch, every drafter, k policy and tree of ``stage.arms``.

It answers the engine seam (pipeline/engines/base.py ``Engine``) in-process: requests are speclab's loops,
passes are timed by speclab.measures.step_costs, the acceptance stage gets one row per iteration of the loop
(replayed from one plain generation where ``stage.replay`` asks), and a divergence is explained by recomputing
the target's logits (``recomputes_logits``).
"""
from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from pipeline.config.schema import K_POLICIES, LLAMA_CPP, ConfigError
from pipeline.engines.option_checks import refuse_engine_keys
from pipeline.config.strategy_config import drafter_class, drafter_conf, drafter_options
from pipeline.jobs.context import StageContext, job_k_max, own_context
from pipeline.jobs.arms import stage_entries
from pipeline.jobs.inputs import find_best_fixed, published_configurations
from pipeline.jobs.context import memory_columns, sampling_config, stage_ks
from pipeline.engines.base import (BLOCK_STEP_FIELDS, AcceptanceRun, Engine, RequestResult, RunResult, StepTimes,
                                   TimedPass)
from speclab.specs.arms import Arm, ArmEntry, Job, expand, expand_all, needs
from speclab.specs.tree_shapes import is_tree, make_tree_drafter, parse_tree
from speclab.decoding.loop import GenerationResult, plain_generate, speculative_generate
from speclab.decoding.sampling import GREEDY
from speclab.drafting.replay import Replay, replayable
from speclab.drafting.replay_check import differences, loop_iterations
from speclab.drafting.replay_reference import greedy_reference
from speclab.measures.peer import hf_generate
from speclab.measures.step_costs import pass_times, prefill_times, step_costs, tree_pass_times
from speclab.models.size import model_size
from speclab.trees.tree_loop import tree_generate
from store.best_fixed import BestFixed

log = logging.getLogger(__name__)
TIME_COLUMNS = ["draft_s", "verify_s", "rollback_s", "total_s", "prefill_s", "wall_s"]


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


def job_tree_drafter(cfg: Any, drafter: str, draft_model: Any) -> Any:
    """The tree drafter of a ``tree:`` arm in a job: prompt-lookup trees take the job drafter's n-gram sizes."""
    ngram = {key: int(cfg.drafter[key]) for key in ("max_ngram", "min_ngram") if key in cfg.drafter}
    return make_tree_drafter(parse_tree(drafter), draft_model, ngram)


def job_arms(ctx: StageContext, ks: list[int]) -> list[Arm]:
    """Plain, then the arms of each ``stage.arms`` entry (speclab.specs.arms), in order."""
    cfg = ctx.cfg
    entries = stage_entries(cfg)
    job = Job(str(cfg.drafter.name), str(cfg.k_policy.name), tuple(ks), int(cfg.k))
    best = None
    if needs(entries, "best_fixed"):  # the exploratory check's best, named now
        found = campaign_best_fixed(cfg)
        best = (found.drafter, found.k)
    published = []
    if needs(entries, "published"):
        published = published_configurations(cfg)
        log.info("speed: the published answer's configurations for pair "
                 f"{cfg.pair.name}: {published or 'none (no published answer for this pair: run dvc repro)'}")
    return expand_all(entries, job, best, published)


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



# -- the acceptance stage's runs: one row per iteration of the loop ----------------------------------------------------
def configurations(cfg: DictConfig) -> list[tuple[str, str, int]]:
    """(drafter, k policy, k) of every loop this job runs: each speculative ``stage.arms`` entry's arms, in order, a
    k of the stage's acceptance ks where the entry names none (speclab.specs.arms.expand)."""
    job = Job(str(cfg.drafter.name), str(cfg.k_policy.name), tuple(stage_ks(cfg, "acceptance_ks")), int(cfg.k))
    arms = [a for e in stage_entries(cfg) if e.method == "speculative" for a in expand(e, job)]
    return list(dict.fromkeys((a.drafter, a.k_policy, int(a.k or 0)) for a in arms))


def replays(cfg: DictConfig, sampling) -> bool:
    """Greedy acceptance from replays (``stage.replay``): sampling runs the loop every time."""
    return bool(cfg.stage.get("replay")) and not sampling.do_sample


def measured_configurations(cfg: DictConfig, confs: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The configurations every prompt runs for real when the others are replayed: one per drafter (the
    job's policy at the job's k where the job runs it, else that drafter's first), so each drafter's
    in-loop costs (a lookup, a catch-up) are timed for a time model, and each checks the replay; and every
    configuration of a drafter the replay cannot reproduce (``unreplayable``)."""
    policy, k = str(cfg.k_policy.name), int(cfg.k)
    loop_only = set(unreplayable(cfg, confs))
    out = []
    for d in dict.fromkeys(c[0] for c in confs):
        mine = [c for c in confs if c[0] == d]
        out += mine if d in loop_only else [(d, policy, k) if (d, policy, k) in mine else mine[0]]
    return out


def unreplayable(cfg: DictConfig, confs: list[tuple[str, str, int]]) -> list[str]:
    """The chain drafters of ``confs`` whose class declares no way to replay them (``Drafter.replay_as``): the
    replay runs the loop for them instead."""
    return [d for d in dict.fromkeys(c[0] for c in confs)
            if not is_tree(d) and not replayable(drafter_class(drafter_conf(cfg, d)))]


def acceptance_runs(ctx: StageContext, prompts: list, gen) -> list[AcceptanceRun]:
    """Every configuration's loop on ``prompts`` (``configurations``), replayed where ``stage.replay`` asks."""
    cfg, pair = ctx.cfg, ctx.pair
    sampling = sampling_config(cfg)
    n_new, merged = int(cfg.max_new_tokens), bool(cfg.merge_prefill)
    confs = configurations(cfg)
    replay_on = replays(cfg, sampling)
    real = measured_configurations(cfg, confs) if replay_on else confs
    loop_only = set(unreplayable(cfg, confs)) if replay_on else set()
    line = (f"acceptance: the replay cannot reproduce drafter {', '.join(sorted(loop_only))} (its class declares "
            "no replay_as): its configurations run the loop")
    if loop_only and line not in ctx.said:  # once a job (a plan's growing sample comes back here)
        ctx.said.add(line)
        logging.getLogger("speclab").info(line)  # the console line the job prints
    replay_on = replay_on and any(c[0] not in loop_only and not is_tree(c[0]) for c in confs)  # any to replay
    refs = {}
    if replay_on:  # one plain generation and one stepwise draft pass per prompt
        for prompt in tqdm(prompts, desc="acceptance: greedy references for the replay", leave=False):
            refs[prompt.id] = greedy_reference(pair.target, pair.draft, ctx.inputs[prompt.id], n_new, pair.eos_token_id,
                                               lookahead=job_k_max(cfg) + 1)
    runs = []
    for conf in [c for c in confs if c in real] + [c for c in confs if c not in real]:
        drafter_name, policy_name, k = conf
        columns = {"k": k, "drafter": drafter_name, "k_policy": policy_name}
        for prompt in tqdm(prompts, desc=f"acceptance {drafter_name} {policy_name} k={k}", leave=False):
            ids = ctx.inputs[prompt.id]
            run = partial(AcceptanceRun, prompt, columns, prompt_len=ids.shape[1])
            if is_tree(drafter_name):  # never replayed: every tree run is real
                res = tree_generate(pair.target, job_tree_drafter(cfg, drafter_name, pair.draft), ids, n_new, sampling,
                                    pair.eos_token_id, gen, merge_prefill=merged)
                runs.append(run(iterations=loop_rows(res, [float("nan")] * len(res.iterations))))
                continue
            s = ctx.strategy(k, drafter_name, policy_name)
            if conf not in real:
                runs.append(run(iterations=replay_rows(refs[prompt.id].replay(s.drafter, s.policy, merged))))
                continue
            res = speculative_generate(pair.target, s.drafter, ids, n_new, k=s.policy, sampling=sampling,
                                       eos_token_id=pair.eos_token_id, generator=gen, merge_prefill=merged)
            agrees = [float("nan")] * len(res.iterations)
            if replay_on and drafter_name not in loop_only:  # the same configuration replayed: where it differs
                # (an fp near-tie), it is counted
                fresh = ctx.strategy(k, drafter_name, policy_name)  # a policy's state starts anew
                agrees = iteration_agreement(refs[prompt.id].replay(fresh.drafter, fresh.policy, merged), res.iterations)
            runs.append(run(iterations=loop_rows(res, agrees)))
    return runs


def loop_rows(res, agrees: list[float]) -> list[dict]:
    """A run's rows' own columns, one per iteration of the loop (chain or tree)."""
    return [{"iteration": i, "proposed": it.k, "accepted": it.accepted, "bonus": it.bonus,
             "new_tokens": it.new_tokens, "length": it.length, "draft_fed": it.draft_fed,
             "draft_calls": it.draft_calls, "draft_s": it.draft_s, "verify_s": it.verify_s,
             "rollback_s": it.rollback_s, "total_s": it.total_s, "prefill_s": res.prefill_s,
             "wall_s": res.wall_s, "with_prompt": it.with_prompt, "replayed": False, "replay_agrees": ag,
             "tree_nodes": float(it.tree_nodes), "draft_call_width": call_width(it)}
            for i, (it, ag) in enumerate(zip(res.iterations, agrees))]


def call_width(it) -> float:
    """The mean width of a tree's draft calls after its first (1: a chain's one-token steps)."""
    later = it.draft_widths[1:]
    return float(np.mean(later)) if later else 1.0


def replay_rows(rep: Replay) -> list[dict]:
    """A replayed run's rows: the loop's counts, no times."""
    return [{"iteration": i, "proposed": st.proposed, "accepted": st.accepted,
             "bonus": 0 < st.proposed == st.accepted, "new_tokens": st.new_tokens, "length": st.length,
             "draft_fed": st.draft_fed, "draft_calls": st.draft_calls, **dict.fromkeys(TIME_COLUMNS, float("nan")),
             "with_prompt": i == 0 and rep.merged, "replayed": True, "replay_agrees": float("nan"),
             "tree_nodes": 0.0, "draft_call_width": 1.0}
            for i, st in enumerate(rep.steps)]


def iteration_agreement(rep: Replay, iterations: list) -> list[float]:
    """1.0 where the replay's iteration i equals the loop's in every count, 0.0 where not."""
    return [float(not diff) for diff in differences(rep, loop_iterations(iterations))]


# -- the timing stage's passes -----------------------------------------------------------------------------------------
def size_columns(target, draft) -> dict:
    """Both models' parameter count, weight bytes and decoder layers, as the timing rows' size columns."""
    out = {}
    for role, model in (("target", target), ("draft", draft)):
        size = model_size(model)
        out.update({f"{role}_params": size.params, f"{role}_bytes": size.bytes, f"{role}_layers": size.layers})
    return out


def time_passes(ctx: StageContext, ids) -> list[TimedPass]:
    """Each model's passes over ``stage.pass_lengths`` new tokens after the prompt (and ``context_extra`` more), in
    torch; the target's check of a tree of ``stage.tree_nodes`` nodes (model target_tree, pass_len n + 1); with
    ``stage.prefill``, each model's prefill of the prompt (context 0)."""
    st = ctx.cfg.stage
    lengths, extras = [int(n) for n in st.pass_lengths], [int(e) for e in st.context_extra]
    n = ids.shape[1]
    out = []
    for role, model in (("target", ctx.pair.target), ("draft", ctx.pair.draft)):
        mem = memory_columns(ctx)  # where the weights are when this time is taken
        timed = [(n + e, t, role) for e in extras
                 for t in pass_times(model, ids, lengths, int(st.repeats), int(st.warmup), context_extra=e)]
        if role == "target" and st.get("tree_nodes"):  # keys of the timing stage (stage=load has neither)
            # model "target_tree": the verification of a tree of n nodes (pass_len n + 1), the 4D mask's path
            trees = tree_pass_times(model, ids, [int(x) for x in st.tree_nodes], int(st.repeats), int(st.warmup))
            timed += [(n, t, "target_tree") for t in trees]
        if st.get("prefill"):
            # Context 0: a prefill of the first pass_len prompt tokens (n - 1 in a loop that prefills apart, n in
            # plain decoding; a merged prefill's prompt plus proposals is the fitted line a few tokens on).
            timed += [(0, t, role) for t in prefill_times(model, ids, sorted({max(n - 1, 1), n}), int(st.repeats),
                                                            int(st.warmup))]
        out += [TimedPass(context_len, label, t, mem) for context_len, t, label in timed]
    return out


def per_position(res: GenerationResult) -> list[int]:
    """Proposals accepted at each draft position 0, 1, ... over the run's iterations."""
    deepest = max((i.k for i in res.iterations), default=0)
    return [sum(1 for i in res.iterations if i.accepted > p) for p in range(deepest)]


def check_entry(e: ArmEntry, drafters: list[str], policies: list[str], speed: bool) -> None:
    """An arm entry speclab's loop runs (one line): a drafter option or a tree, a k policy option, none of another
    engine's own settings; in a job without a speed part, speculative entries only (the acceptance stage's loops)."""
    shown = e.given()
    if e.drafter is not None and e.drafter not in drafters:
        raise ConfigError(f"stage.arms entry {shown}: drafter {e.drafter!r} is not a drafter option: use null or one "
                          f"of {drafters} (an engine's own types run under its engine=)")
    if e.k_policy is not None and e.k_policy not in policies:
        raise ConfigError(f"stage.arms entry {shown}: k_policy {e.k_policy!r} is not allowed: use null or one of {policies}")
    if e.settings is not None or e.default:
        raise ConfigError(f"stage.arms entry {shown}: settings and default are an engine's own (engine=llama_cpp); "
                          "speclab's loop is configured by the drafter and k_policy options")
    if not speed and e.method != "speculative":
        raise ConfigError(f"stage.arms entry {shown}: method {e.method} runs in the speed stage; this job's parts "
                          "run speculative entries only")


class SpeclabRunner(Engine):
    """The engine seam answered by speclab's loop."""

    name = "speclab"
    stage_parts = None  # every stage part
    counts_iterations = True
    recomputes_logits = True

    def __init__(self, name: str = "speclab", **_: Any) -> None:
        self.name = name

    @classmethod
    def check(cls, cfg: DictConfig, parts: list[str]) -> None:
        refuse_engine_keys(cfg, parts, LLAMA_CPP)  # llama.cpp's own keys (stage.tie_nats)
        for e in stage_entries(cfg):
            check_entry(e, drafter_options(cfg), list(K_POLICIES), "speed" in parts)

    def context(self, cfg: DictConfig, prompts) -> StageContext:
        ctx = own_context(cfg, prompts)
        ctx.runner = self
        return ctx

    def arms(self, ctx: StageContext, ks: list[int]) -> list[Arm]:
        return job_arms(ctx, ks)

    def warm_arms(self, arms: list[Arm]) -> list[Arm]:
        """Plain, the first speculative arm and every tree arm (a tree's passes take masks and widths no chain ran)."""
        return arms[:2] + [arm for arm in arms[2:] if arm.is_tree]

    def prepare(self, ctx: StageContext, arms: list[Arm]) -> None:
        """A price table an adaptive policy (the job's or the plan's) reads: measured before the runs."""
        for arm in arms:
            if arm.ours and not arm.is_tree:
                ctx.prices(arm.k_policy)

    def run(self, ctx: StageContext, arm: Arm, ids, gen) -> RunResult:
        return RunResult(*run_arm(ctx, arm, ids, gen))

    def request(self, ctx: StageContext, arm: Arm, ids, gen=None, n_probs: int = 0, greedy: bool = False) -> RequestResult:
        """One run of the loop (plain decoding or a chain of ``arm``); no top probabilities (``recomputes_logits``)."""
        pair, cfg = ctx.pair, ctx.cfg
        n_new, sampling = int(cfg.max_new_tokens), GREEDY if greedy else sampling_config(cfg)
        if arm.ours and not arm.is_tree:
            s = ctx.strategy(arm.k, arm.drafter, arm.k_policy)
            r = speculative_generate(pair.target, s.drafter, ids, n_new, k=s.policy, sampling=sampling,
                                     eos_token_id=pair.eos_token_id, generator=gen,
                                     merge_prefill=bool(cfg.merge_prefill))
        elif arm.method == "plain":
            r = plain_generate(pair.target, ids, n_new, sampling, pair.eos_token_id, gen)
        else:
            toks, wall, prompt, loop = run_arm(ctx, arm, ids, gen)
            return RequestResult(toks, wall, prompt, wall - prompt, loop=loop)
        loop = [i for i in r.iterations if not i.with_prompt]
        return RequestResult(r.tokens, r.wall_s, prompt_s(r), r.wall_s - prompt_s(r), drafted=r.proposed,
                             accepted=sum(i.accepted for i in r.iterations), passes=len(loop) if r.iterations else None,
                             accepted_per_pos=per_position(r), loop=_breakdown(r))

    def prepare_load(self, ctx: StageContext, arm: Arm, concurrency: int) -> None:
        """Any load: its requests are one batch (memory permitting; the loop checks its shapes)."""

    def serve_load(self, ctx: StageContext, arm: Arm, inputs: list, concurrency: int):
        """Waves of ``concurrency`` requests through the batched loop (engines/speclab/load.py)."""
        from engines.speclab.load import serve_waves
        return serve_waves(ctx, arm, inputs, concurrency)

    def acceptance_runs(self, ctx: StageContext, prompts: list, ks: list[int], gen) -> list[AcceptanceRun]:
        return acceptance_runs(ctx, prompts, gen)

    def time_passes(self, ctx: StageContext, prompt_id: str, ids) -> list[TimedPass]:
        return time_passes(ctx, ids)

    def model_sizes(self, ctx: StageContext) -> dict:
        return size_columns(ctx.pair.target, ctx.pair.draft)

    def step_times(self, ctx: StageContext, ks: list[int], progress: str | None = None) -> StepTimes:
        return StepTimes(*step_times(ctx, ks, progress))

    def block_step_times(self, ctx: StageContext, ids) -> dict[str, float]:
        return block_step_times(ctx, ids)

    def memory(self, ctx: StageContext) -> dict:
        return memory_columns(ctx)

    def weights(self, cfg: DictConfig) -> str:
        return str(cfg.pair.dtype)

    def draft_name(self, cfg: DictConfig) -> str:
        return str(cfg.pair.draft)
