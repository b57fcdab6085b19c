"""Stage speed: plain and speculative runs back to back, order rotating, ratios of adjacent runs only.

Step timings are taken before and after the runs so analysis can predict the speed-up from
them and detect drift; each speculative run also records its per-iteration time breakdown.
"""
from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.context import StageContext
from pipeline.parquet import make_schema
from pipeline.stages import StageOutput
from pipeline.strategies import make_drafter, make_policy
from pipeline.stages.common import (
    IDENTITY_FIELDS, MEMORY_FIELDS, generator, identity, memory_columns, sampling_config, stage_ks,
)
from speclab.loop import GenerationResult, plain_generate, speculative_generate
from speclab.peer import hf_generate
from speclab.step_costs import step_costs

STEP_FIELDS = [f"{name}_{when}_s" for when in ("before", "after") for name in ("target_step", "draft_step", "verify")]
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("round", "int32"), ("rotation", "int32"), ("block", "int32"), ("prompt_id", "string"), ("kind", "string"),
    ("arm", "string"), ("position", "int32"), ("k", "int32"), ("drafter", "string"), ("k_policy", "string"),
    ("mean_k", "float64"), ("do_sample", "bool"), ("temperature", "float64"),
    ("top_p", "float64"), ("new_tokens", "int32"), ("wall_s", "float64"), ("prefill_s", "float64"),
    ("tokens_per_s", "float64"), ("ratio_to_adjacent_plain", "float64"), ("acceptance_rate", "float64"),
    ("tokens_per_pass", "float64"), ("iterations", "int32"), ("draft_s_per_iter", "float64"),
    ("verify_s_per_iter", "float64"), ("rollback_s_per_iter", "float64"), ("bookkeeping_s_per_iter", "float64"),
    ("identical_to_plain", "bool"),
] + [(f, "float64") for f in STEP_FIELDS] + MEMORY_FIELDS)


def step_times(ctx: StageContext, ks: list[int]) -> tuple[float, float, dict[int, float]]:
    """Target step, draft step and the verification pass (k+1 new tokens) per k, on the first prompt."""
    st = ctx.cfg.stage
    ids = ctx.inputs[ctx.prompts[0].id]
    c = step_costs(ctx.pair.target, ctx.pair.draft, ids, ks, int(st.timing_repeats), int(st.timing_warmup))
    return c.target_step_s, c.draft_step_s, c.verify_s


def _breakdown(res: GenerationResult) -> dict[str, float]:
    n = len(res.iterations)
    if not n:
        return {"acceptance_rate": float("nan"), "tokens_per_pass": float("nan"), "iterations": 0, "mean_k": float("nan"),
                **{f"{p}_s_per_iter": float("nan") for p in ("draft", "verify", "rollback", "bookkeeping")}}
    return {"acceptance_rate": res.acceptance_rate, "tokens_per_pass": res.tokens_per_target_pass, "iterations": n,
            "mean_k": res.proposed / n,
            "draft_s_per_iter": sum(i.draft_s for i in res.iterations) / n,
            "verify_s_per_iter": sum(i.verify_s for i in res.iterations) / n,
            "rollback_s_per_iter": sum(i.rollback_s for i in res.iterations) / n,
            "bookkeeping_s_per_iter": sum(i.bookkeeping_s for i in res.iterations) / n}


Arm = tuple[str, int, str]  # (method, k, k policy); k = 0 for plain, the starting k for adaptive policies


def arms(ctx: StageContext, ks: list[int]) -> list[Arm]:
    """Plain, speculative at each fixed k, each adaptive k policy, and (optionally) the peer at each k."""
    default = str(ctx.cfg.k_policy.name)
    out: list[Arm] = [("plain", 0, "none")] + [("speculative", k, default) for k in ks]
    out += [("speculative", int(ctx.cfg.k), str(p)) for p in ctx.cfg.stage.get("k_policies") or [] if p != default]
    if ctx.cfg.stage.peer:
        out += [("hf_assisted", k, "fixed") for k in ks]
    return out


def run_arm(ctx: StageContext, arm: Arm, ids, gen) -> tuple[list[int], float, float, dict]:
    pair = ctx.pair
    (method, k, policy), n_new, sampling = arm, int(ctx.cfg.max_new_tokens), sampling_config(ctx.cfg)
    if method == "plain":
        r = plain_generate(pair.target, ids, n_new, sampling, pair.eos_token_id, gen)
        return r.tokens, r.wall_s, r.prefill_s, _breakdown(r)
    if method == "speculative":
        r = speculative_generate(pair.target, make_drafter(ctx), ids, n_new, k=make_policy(ctx, policy, k, ctx.costs()),
                                 sampling=sampling, eos_token_id=pair.eos_token_id, generator=gen)
        return r.tokens, r.wall_s, r.prefill_s, _breakdown(r)
    toks, wall = hf_generate(pair.target, ids, n_new, assistant=pair.draft, k=k, sampling=sampling,
                             eos_token_id=pair.eos_token_id)
    return toks, wall, float("nan"), _breakdown(GenerationResult(toks, ids.shape[1], wall, float("nan")))


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    ks, sampling = stage_ks(cfg), sampling_config(cfg)
    names = arms(ctx, ks)
    gen = generator(ctx)
    ctx.costs()  # measured before the runs when an adaptive policy needs them
    for arm in names[:2]:  # warm-up
        run_arm(ctx, arm, ctx.inputs[ctx.prompts[0].id], gen)
    arm_ks = sorted({k for _, k, _ in names if k})
    before = step_times(ctx, arm_ks)
    rows, block = [], 0
    for r in range(int(st.rounds)):
        for prompt in tqdm(ctx.prompts, desc=f"speed k={ks} round {r}", leave=False):
            # Rotate which arm goes first so slow drift cannot favour one arm systematically.
            shift = (int(cfg.rotation) + int(cfg.round) + block) % len(names)
            order = names[shift:] + names[:shift]
            ids = ctx.inputs[prompt.id]
            results = {arm: run_arm(ctx, arm, ids, gen) for arm in order}
            plain_tokens, plain_wall = results[("plain", 0, "none")][:2]
            plain_tps = len(plain_tokens) / plain_wall
            mem = memory_columns(ctx)
            for arm in order:
                toks, wall, prefill, extra = results[arm]
                tps = len(toks) / wall
                rows.append({**identity(ctx), "round": int(cfg.round) + r, "rotation": int(cfg.rotation),
                             "block": block, "prompt_id": prompt.id, "kind": prompt.kind, "arm": arm[0],
                             "position": order.index(arm), "k": arm[1], "k_policy": arm[2],
                             "drafter": "none" if arm[0] == "plain" else (
                                 "model" if arm[0] == "hf_assisted" else str(cfg.drafter.name)),
                             "do_sample": sampling.do_sample,
                             "temperature": sampling.temperature, "top_p": sampling.top_p,
                             "new_tokens": len(toks), "wall_s": wall, "prefill_s": prefill, "tokens_per_s": tps,
                             "ratio_to_adjacent_plain": tps / plain_tps,
                             "identical_to_plain": toks == plain_tokens, **extra, **mem})
            block += 1
    after = step_times(ctx, arm_ks)
    df = pd.DataFrame(rows)
    for when, (t_step, d_step, verify) in (("before", before), ("after", after)):
        df[f"target_step_{when}_s"] = t_step
        df[f"draft_step_{when}_s"] = d_step
        df[f"verify_{when}_s"] = df.k.map(verify).astype(float)  # NaN for plain rows
    return StageOutput(df, *summarize(df, cfg))


def summarize(df: pd.DataFrame, cfg: DictConfig) -> tuple[dict[str, float], list[str]]:
    """Headline metrics and summary lines of a speed result (also used to log a run from its file)."""
    first = df.iloc[0]
    before = (first.target_step_before_s, first.draft_step_before_s)
    after = (first.target_step_after_s, first.draft_step_after_s)
    spec = df[df.arm == "speculative"]
    metrics = {"plain_tokens_per_s_median": df[df.arm == "plain"].tokens_per_s.median(),
               "identical_share": spec.identical_to_plain.mean(),
               "drift_target_step_ratio": after[0] / before[0],
               "target_step_before_ms": 1e3 * before[0], "target_step_after_ms": 1e3 * after[0],
               "draft_step_before_ms": 1e3 * before[1], "draft_step_after_ms": 1e3 * after[1]}
    summary = [f"plain {metrics['plain_tokens_per_s_median']:.1f} tok/s (median); speculative outputs identical "
               f"to the adjacent plain run in {int(spec.identical_to_plain.sum())} of {len(spec)} runs",
               f"step times before/after: target {1e3 * before[0]:.1f}/{1e3 * after[0]:.1f} ms, "
               f"draft {1e3 * before[1]:.1f}/{1e3 * after[1]:.1f} ms"]
    for (method, k, policy), sub in df[df.arm != "plain"].groupby(["arm", "k", "k_policy"], sort=False):
        key = f"{method}.k{k}" + ("" if policy == "fixed" else f".{policy}")
        metrics[f"speedup_median.{key}"] = sub.ratio_to_adjacent_plain.median()
        per_kind = ", ".join(f"{kind} {s.ratio_to_adjacent_plain.median():.2f} (alpha {s.acceptance_rate.mean():.2f})"
                             for kind, s in sub.groupby("kind", sort=False))
        for kind, s in sub.groupby("kind", sort=False):
            metrics[f"speedup_median.{key}.{kind}"] = s.ratio_to_adjacent_plain.median()
        for part in ("draft", "verify", "rollback", "bookkeeping"):
            metrics[f"{part}_ms_per_iter.{key}"] = 1e3 * sub[f"{part}_s_per_iter"].mean()
        summary.append(f"{method} k={k}" + ("" if policy == "fixed" else f" ({policy}, mean k {sub.mean_k.mean():.1f})")
                       + f" [{sub.drafter.iloc[0]} drafter]: speed-up over adjacent plain {sub.ratio_to_adjacent_plain.median():.2f} "
                       f"[{per_kind}]; per iteration draft {metrics[f'draft_ms_per_iter.{key}']:.1f} ms, verify "
                       f"{metrics[f'verify_ms_per_iter.{key}']:.1f} ms, rollback "
                       f"{metrics[f'rollback_ms_per_iter.{key}']:.2f} ms, bookkeeping "
                       f"{metrics[f'bookkeeping_ms_per_iter.{key}']:.2f} ms")
    return metrics, summary
