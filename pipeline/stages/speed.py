"""Stage speed: plain and speculative runs back to back, order rotating, ratios of adjacent runs only.

Step timings are taken before and after the runs so analysis can predict the speed-up from
them and detect drift; each speculative run also records its per-iteration time breakdown.
"""
from __future__ import annotations

import logging
from collections import Counter

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from pipeline.context import StageContext
from pipeline.job_arms import stage_entries
from pipeline.job_inputs import find_best_fixed, latest_plan_file
from pipeline.stages import ArmResult, StageOutput, by_kind, single_arm_metrics
from pipeline.stages.common import (
    IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, generator, identity, ks_label, memory_columns, rotated, run_name,
    min_runs, sampling_config, speedup_metrics, speedup_text, stage_ks,
)
from pipeline.trees import job_tree_drafter
from speclab.arms import PLAIN, RECOMMENDED, Arm, Job, expand_all, needs
from speclab.loop import GenerationResult, plain_generate, speculative_generate
from speclab.peer import hf_generate
from speclab.step_costs import step_costs
from speclab.tree_loop import tree_generate
from speclab.tree_specs import is_tree
from store.best_fixed import BestFixed
from store.records import make_schema

log = logging.getLogger(__name__)
STEP_FIELDS = [f"{name}_{when}_s" for when in ("before", "after") for name in ("target_step", "draft_step", "verify")]
# One-token step times taken in each block just before its runs (stage.block_timing_repeats > 0; NaN
# otherwise): the machine's state at the time of the runs, for a time model priced at that state.
BLOCK_STEP_FIELDS = ["block_target_step_s", "block_draft_step_s"]
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("round", "int32"), ("rotation", "int32"), ("block", "int32"), ("prompt_id", "string"), ("kind", "string"),
    ("arm", "string"), ("position", "int32"), ("k", "int32"), ("drafter", "string"), ("k_policy", "string"),
    ("mean_k", "float64"), ("do_sample", "bool"), ("temperature", "float64"),
    ("top_p", "float64"), ("new_tokens", "int32"), ("wall_s", "float64"), ("prefill_s", "float64"),
    ("tokens_per_s", "float64"), ("ratio_to_adjacent_plain", "float64"), ("acceptance_rate", "float64"),
    ("tokens_per_pass", "float64"), ("iterations", "int32"), ("draft_s_per_iter", "float64"),
    ("verify_s_per_iter", "float64"), ("rollback_s_per_iter", "float64"), ("bookkeeping_s_per_iter", "float64"),
    ("identical_to_plain", "bool"), ("merged_prefill", "bool"),
    ("tree_nodes", "float64"), ("checked_by_depth", "string"), ("accepted_by_depth", "string"),
    ("draft_calls_by_width", "string"), ("passes_by_width", "string"), ("loop_new_tokens", "int32"),
] + [(f, "float64") for f in STEP_FIELDS + BLOCK_STEP_FIELDS] + MEMORY_FIELDS + TRUST_FIELDS)


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
    """Plain, then the arms of each ``stage.arms`` entry (speclab.arms), in order."""
    cfg = ctx.cfg
    entries = stage_entries(cfg)
    job = Job(str(cfg.drafter.name), str(cfg.k_policy.name), tuple(ks), int(cfg.k))
    best = None
    if needs(entries, "best_fixed"):  # the exploratory check's best, named now
        found = campaign_best_fixed(cfg)
        best = (found.drafter, found.k)
    return expand_all(entries, job, best)


def resolve(arm: Arm, kind: str, plan: dict[str, Arm] | None) -> Arm:
    """The configuration an arm runs for a prompt of this kind (the plan's choice for the recommended arm)."""
    if arm != RECOMMENDED:
        return arm
    assert plan is not None
    return plan.get(kind) or plan["all"]


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


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    ks, sampling = stage_ks(cfg), sampling_config(cfg)
    names = job_arms(ctx, ks)
    plan = latest_plan(ctx.cfg) if RECOMMENDED in names else None
    runs = [*names, *(plan or {}).values()]
    gen = generator(ctx)
    for arm in runs:  # a price table an adaptive policy (the job's or the plan's) reads: measured before the runs
        if arm.ours and not arm.is_tree:
            ctx.prices(arm.k_policy)
    # A tree arm's passes take masks and widths no chain ran: each is warmed up too.
    warm = names[:2] + [arm for arm in names[2:] if arm.is_tree]
    log.info("speed: warm-up (plain, the first speculative arm and every tree arm on one prompt)")
    for arm in tqdm(warm, desc="speed warm-up", leave=False):
        run_arm(ctx, arm, ctx.inputs[ctx.prompts[0].id], gen)
    arm_ks = sorted({arm.k for arm in runs if arm.k and not arm.is_tree})
    log.info(f"speed: step and pass times before the runs (k = {arm_ks}, {st.timing_repeats} repeats)")
    before = step_times(ctx, arm_ks, "step times before")
    rows, block = [], 0
    for r in range(int(st.rounds)):
        for prompt in tqdm(ctx.prompts, desc=f"speed {len(names)} arms round {r}", leave=False):
            ctx.load.sample()  # between blocks: the machine's load while the runs are timed
            order = rotated(names, cfg, block)
            ids = ctx.inputs[prompt.id]
            now = block_step_times(ctx, ids)
            results = {arm: run_arm(ctx, resolve(arm, prompt.kind, plan), ids, gen) for arm in order}
            plain_tokens, plain_wall = results[PLAIN][:2]
            plain_tps = len(plain_tokens) / plain_wall
            mem = memory_columns(ctx)
            for arm in order:
                toks, wall, prefill, extra = results[arm]
                tps = len(toks) / wall
                rows.append({**identity(ctx), "round": int(cfg.round) + r, "rotation": int(cfg.rotation),
                             "block": block, "prompt_id": prompt.id, "kind": prompt.kind, "arm": arm.method,
                             "position": order.index(arm), **resolve(arm, prompt.kind, plan).columns(),
                             "do_sample": sampling.do_sample,
                             "temperature": sampling.temperature, "top_p": sampling.top_p,
                             "new_tokens": len(toks), "wall_s": wall, "prefill_s": prefill, "tokens_per_s": tps,
                             "ratio_to_adjacent_plain": tps / plain_tps,
                             "identical_to_plain": toks == plain_tokens, **extra, **now, **mem})
            block += 1
    log.info("speed: step and pass times after the runs (drift check)")
    after = step_times(ctx, arm_ks, "step times after")
    df = pd.DataFrame(rows)
    for when, (t_step, d_step, verify) in (("before", before), ("after", after)):
        df[f"target_step_{when}_s"] = t_step
        df[f"draft_step_{when}_s"] = d_step
        # NaN for plain rows and trees (a tree's pass is wider than its depth + 1: stage timing's tree_nodes)
        df[f"verify_{when}_s"] = df.k.map(verify).astype(float).where(~df.drafter.map(is_tree), float("nan"))
    return summarize(df, cfg)


def describe(cfg: DictConfig) -> str:
    entries = stage_entries(cfg)
    # The best fixed configuration's k is the exploratory check's, not the job's.
    return run_name(cfg, "speed", ["best-fixed"] if needs(entries, "best_fixed") else [ks_label(stage_ks(cfg))],
                    ["+recommended"] if needs(entries, "recommended") else [])


def latest_plan(cfg: DictConfig) -> dict[str, Arm]:
    """kind -> the recommended configuration of this pair's most recent plan in this campaign."""
    plan = latest_plan_file(cfg)
    if plan is None:
        raise ValueError(f"a recommended arm (stage.arms) needs a plan for pair {cfg.pair.name} in campaign {cfg.campaign}: "
                         f"run `python -m pipeline.run +sweep=plan campaign={cfg.campaign}` first")
    rec = pd.read_parquet(plan)
    rec = rec[rec.recommended]
    return {str(r.kind): Arm("recommended", int(r.k) or None, str(r.k_policy), str(r.drafter))
            for r in rec.itertuples()}


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


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline numbers of a speed result: per arm and kind (child runs), and for the job."""
    first = df.iloc[0]
    before = (first.target_step_before_s, first.draft_step_before_s)
    after = (first.target_step_after_s, first.draft_step_after_s)
    plain, spec = df[df.arm == "plain"], df[df.arm == "speculative"]
    arms = []
    for (method, k, policy, drafter), sub in df[df.arm != "plain"].groupby(["arm", "k", "k_policy", "drafter"],
                                                                           sort=False):
        arm = Arm(method, int(k) or None, policy, drafter)
        for kind, s in by_kind(sub):
            arms.append(ArmResult(
                arm.run_name(kind),
                {"arm": method, "k": int(k), "k_policy": policy, "drafter": drafter, "kind": kind,
                 "do_sample": bool(s.do_sample.iloc[0]), "temperature": float(s.temperature.iloc[0]),
                 "top_p": float(s.top_p.iloc[0])},
                {**speedup_metrics(s, plain, min_runs(cfg)), "alpha": s.acceptance_rate.mean(), "tokens_per_pass": s.tokens_per_pass.mean(),
                 **{f"{part}_ms_per_iter": 1e3 * s[f"{part}_s_per_iter"].mean()
                    for part in ("draft", "verify", "rollback", "bookkeeping")},
                 "mean_k": s.mean_k.mean(), "identical_share": s.identical_to_plain.mean(), "runs": len(s),
                 **({"tree_nodes": s.tree_nodes.mean()} if arm.is_tree else {})}))
    drift = max(max(a / b, b / a) for a, b in zip(after, before))
    metrics = {"plain_tokens_per_s": plain.tokens_per_s.median(), "identical_share": spec.identical_to_plain.mean(),
               "drift_ratio": drift,
               "target_step_before_ms": 1e3 * before[0], "target_step_after_ms": 1e3 * after[0],
               "draft_step_before_ms": 1e3 * before[1], "draft_step_after_ms": 1e3 * after[1],
               **single_arm_metrics([a for a in arms if a.params["kind"] == "all"] or arms)}
    summary = [f"plain {metrics['plain_tokens_per_s']:.1f} tok/s (median); speculative outputs identical "
               f"to the adjacent plain run in {int(spec.identical_to_plain.sum())} of {len(spec)} runs",
               f"step times before/after: target {1e3 * before[0]:.1f}/{1e3 * after[0]:.1f} ms, "
               f"draft {1e3 * before[1]:.1f}/{1e3 * after[1]:.1f} ms (drift x{drift:.2f})"]
    for arm in arms:
        m = arm.metrics
        summary.append(f"{arm.name}: {speedup_text(m)}, alpha {m['alpha']:.2f}, "
                       f"{m['spec_tokens_per_s']:.1f} vs {m['plain_tokens_per_s']:.1f} tok/s; "
                       f"per iteration draft {m['draft_ms_per_iter']:.1f} ms, verify {m['verify_ms_per_iter']:.1f} ms, "
                       f"rollback {m['rollback_ms_per_iter']:.2f} ms, bookkeeping {m['bookkeeping_ms_per_iter']:.2f} ms")
    return StageOutput(df, metrics, summary, arms)
