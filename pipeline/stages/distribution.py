"""Stage distribution: does each acceptance rule reproduce the target's next-token distribution?

At each context take the target's real distribution p and the draft's q, draw N first tokens
through each rule, and test the counts of the 60 most likely tokens plus a pooled remainder
against p. Contexts are the prompts' ends, or the positions along generated text where target
and draft disagree most (``stage.contexts=max_tv``), where the test has power. The power of
the test against the wrong rules is estimated by simulation from the exact p and q. Optionally
transformers' own assisted sampling is tested the same way (``stage.hf_conformance=true``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from omegaconf import DictConfig
import torch
from tqdm import tqdm

from pipeline.jobs.context import StageContext
from store.records import make_schema
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, identity
from pipeline.jobs.run_names import run_name
from pipeline.jobs.context import sampling_config
from pipeline.engines.base import engine_of
from pipeline.config.stage_options import unused_note
from speclab.decoding.acceptance import SAMPLING_RULES, first_token_draws, rule_output_distribution
from speclab.measures.contexts import Context, max_tv_contexts, prompt_context
from speclab.measures.peer import hf_generate
from speclab.decoding.sampling import SamplingConfig
from speclab.stats.goodness_of_fit import chi_square_power, chi_square_top

WRONG_RULES = ("resample_target", "keep_draft")
HF_RULE = "transformers_assisted"
CONTEXT_MODES = ("prompt", "max_tv")
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("context_mode", "string"), ("context_position", "int32"),
    ("seed", "int32"), ("rule", "string"), ("draws", "int64"), ("temperature", "float64"), ("top_k", "int32"),
    ("top_p", "float64"), ("statistic", "float64"), ("pvalue", "float64"), ("dof", "int32"),
    ("total_variation", "float64"), ("expected_acceptance", "float64"), ("power", "float64"),
    ("no_power", "bool"), ("rejected", "bool"),
])


def contexts_for(ctx: StageContext, ids: torch.Tensor, sampling: SamplingConfig) -> list[Context]:
    st, pair = ctx.cfg.stage, ctx.pair
    mode = str(st.contexts)
    if mode == "prompt":
        return [prompt_context(pair.target, pair.draft, ids, sampling)]
    if mode == "max_tv":
        return max_tv_contexts(pair.target, pair.draft, ids, int(ctx.cfg.max_new_tokens),
                               int(st.contexts_per_prompt), sampling)
    raise ValueError(f"stage.contexts={mode!r} is not allowed: use one of {list(CONTEXT_MODES)}")


def power_against_wrong_rules(c: Context, n: int, level: float, sims: int, top: int) -> dict[str, float]:
    p = c.p.cpu().numpy()
    return {rule: chi_square_power(rule_output_distribution(c.p, c.q, rule).cpu().numpy(), p, n, level, sims, top)
            for rule in WRONG_RULES}


def rule_counts(c: Context, n: int, rule: str, seed: int) -> np.ndarray:
    """Counts over the vocabulary of ``n`` first tokens drawn through ``rule`` at context ``c`` (its p and q)."""
    g = torch.Generator(device=c.p.device).manual_seed(seed)
    draws = first_token_draws(c.p, c.q.to(c.p.device), n, rule, g)
    return np.bincount(draws.cpu().numpy(), minlength=c.p.shape[0])


def engine_wrong_rule(engine_rule: str, wrong: str) -> str:
    """The rows of a wrong rule at an engine's contexts, proposals and number of draws (``<engine rule> as
    keep_draft``): what the engine's test would say had its sampler that rule."""
    return f"{engine_rule} as {wrong}"


def hf_first_tokens(ctx: StageContext, c: Context, runs: int, sampling: SamplingConfig, seed: int) -> np.ndarray:
    """Counts of the first new token over ``runs`` calls of generate(assistant_model=..., do_sample=True)."""
    counts = np.zeros(c.p.shape[0], dtype=np.int64)
    torch.manual_seed(seed)  # transformers samples from torch's global generator
    for _ in tqdm(range(runs), desc="transformers assisted sampling", leave=False):
        # Two new tokens: the draft proposes one, so the first token passes through the acceptance rule.
        toks, _ = hf_generate(ctx.pair.target, c.ids, 2, assistant=ctx.pair.draft, k=int(ctx.cfg.k),
                              sampling=sampling, eos_token_id=None)
        counts[toks[0]] += 1
    return counts


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    # This stage is about sampling whatever the sampling group says: temperature, top-k and top-p
    # come from it, and greedy would make transformers' sampler (below) decode by arg-max.
    sampling = dataclasses.replace(sampling_config(cfg), do_sample=True)
    n, level, top = int(st.draws), float(st.alpha_level), int(st.top_tokens)
    sims = int(st.power_sims)
    rows = []

    def record(prompt, c: Context, seed: int, rule: str, counts: np.ndarray, power: float) -> None:
        res = chi_square_top(counts, c.p.cpu().numpy(), top)
        expected_acc = float(torch.minimum(c.p, c.q).sum())
        no_power = expected_acc > float(st.no_power_acceptance)
        rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind,
                     "context_mode": str(st.contexts), "context_position": c.position,
                     "seed": seed, "rule": rule, "draws": int(counts.sum()), "temperature": sampling.temperature,
                     "top_k": sampling.top_k, "top_p": sampling.top_p, "statistic": res.statistic,
                     "pvalue": res.pvalue, "dof": res.dof, "total_variation": c.total_variation,
                     "expected_acceptance": expected_acc, "power": power, "no_power": no_power,
                     "rejected": res.pvalue < level})

    hf_done = 0
    engine = engine_of(ctx)
    for prompt in tqdm(ctx.prompts, desc="distribution", leave=False):
        for c in contexts_for(ctx, ctx.inputs[prompt.id], sampling):
            power = power_against_wrong_rules(c, n, level, sims, top)
            for seed in st.seeds:
                for rule in SAMPLING_RULES:
                    # For a wrong rule: the chance to catch it; for the correct rule: the weaker of the two.
                    record(prompt, c, int(seed), rule, rule_counts(c, n, rule, int(seed)),
                           power.get(rule, min(power.values())))
            if st.hf_conformance and hf_done < int(st.hf_contexts):
                runs = int(st.hf_runs)
                hf_power = power_against_wrong_rules(c, runs, level, sims, top)
                record(prompt, c, 0, HF_RULE, hf_first_tokens(ctx, c, runs, sampling, int(cfg.seed)),
                       min(hf_power.values()))
                hf_done += 1
            # an engine's own speculative sampler (one that samples outside speclab's loop): its draws against p,
            # with the power its own proposals give the wrong rules at that many draws
            for d in engine.sampler_draws(ctx, c, int(st.engine_runs), sampling, int(cfg.seed)):
                at = dataclasses.replace(c, q=d.q) if d.q is not None else c
                drawn = int(d.counts.sum())
                power = power_against_wrong_rules(at, drawn, level, sims, top)
                record(prompt, at, 0, d.rule, d.counts, min(power.values()))
                if d.q is not None:  # the same test, draws and proposals, given a wrong rule's output: it must fail
                    for rule in WRONG_RULES:
                        record(prompt, at, 0, engine_wrong_rule(d.rule, rule), rule_counts(at, drawn, rule,
                                                                                           int(cfg.seed)), power[rule])
    df = pd.DataFrame(rows)
    return summarize(df, cfg)


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "distribution")


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline metrics and summary lines of a distribution result (also used to log a run from its file)."""
    st = cfg.stage
    level = float(st.alpha_level)
    n = int(st.draws)
    metrics, summary, arms = {}, [], []
    powered = df[~df.no_power]
    engines = [r for r in dict.fromkeys(df.rule) if r not in (*SAMPLING_RULES, HF_RULE)]
    for rule in [*SAMPLING_RULES, HF_RULE, *engines]:
        sub = powered[powered.rule == rule]
        if not len(sub):
            if rule in engines:  # an engine's sampler where no context had power: said, not dropped
                every = df[df.rule == rule]
                summary.append(f"  rule {rule:22s} rejected at p<{level} in {int(every.rejected.sum())} of "
                               f"{len(every)} tests, none with power (its proposals agree with the target there)")
            continue
        arms.append(ArmResult(f"rule {rule}", {"rule": rule, "contexts": str(st.contexts)},
                              {"rejection_rate": sub.rejected.mean(), "mean_power": sub.power.mean(),
                               "tests": len(sub), "min_pvalue": sub.pvalue.min()}))
        summary.append(f"  rule {rule:22s} rejected at p<{level} in {int(sub.rejected.sum())} of {len(sub)} tests "
                       f"with power (min p-value {sub.pvalue.min():.3g}; mean power vs wrong rules {sub.power.mean():.2f})")
    metrics["no_power_contexts"] = int(df[df.rule == "correct"].drop_duplicates(["prompt_id", "context_position"])
                                       .no_power.sum())
    summary.insert(0, f"{df[df.rule == 'correct'].drop_duplicates(['prompt_id', 'context_position']).shape[0]} "
                      f"contexts ({st.contexts}) x {len(st.seeds)} seeds x {n} draws; "
                      f"{metrics['no_power_contexts']} contexts have no power (expected acceptance > "
                      f"{st.no_power_acceptance}); TV(p, q) {df.total_variation.min():.2f}..{df.total_variation.max():.2f}")
    return StageOutput(df, metrics, summary + unused_note(cfg, "distribution"), arms)
