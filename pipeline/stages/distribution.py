"""Stage distribution: does each acceptance rule reproduce the target's next-token distribution?

At each context take the target's real distribution p and the draft's q, draw N first tokens
through each rule, and test the counts of the 60 most likely tokens plus a pooled remainder
against p. Contexts where p and q nearly agree give the test no power and are flagged.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from pipeline.context import StageContext
from pipeline.parquet import make_schema
from pipeline.stages import StageOutput
from pipeline.stages.common import IDENTITY_FIELDS, identity, sampling_config
from speclab.acceptance import SAMPLING_RULES, first_token_draws
from speclab.cache import forward_logits, new_cache
from speclab.sampling import logits_to_probs
from speclab.stats import chi_square_top

SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("seed", "int32"), ("rule", "string"), ("draws", "int64"),
    ("temperature", "float64"), ("top_k", "int32"), ("top_p", "float64"), ("statistic", "float64"),
    ("pvalue", "float64"), ("dof", "int32"), ("total_variation", "float64"), ("expected_acceptance", "float64"),
    ("no_power", "bool"), ("rejected", "bool"),
])


@torch.inference_mode()
def next_token_probs(model: torch.nn.Module, ids: torch.Tensor, sampling) -> torch.Tensor:
    return logits_to_probs(forward_logits(model, ids, new_cache(model), 1)[-1], sampling).double()


def run(ctx: StageContext) -> StageOutput:
    cfg, st, pair = ctx.cfg, ctx.cfg.stage, ctx.pair
    sampling = sampling_config(cfg)
    n, alpha_level = int(st.draws), float(st.alpha_level)
    rows = []
    for prompt in tqdm(ctx.prompts, desc="distribution", leave=False):
        ids = ctx.inputs[prompt.id]
        p = next_token_probs(pair.target, ids, sampling)
        q = next_token_probs(pair.draft, ids, sampling)
        tv = 0.5 * float((p - q).abs().sum())
        expected_acc = float(torch.minimum(p, q).sum())
        no_power = expected_acc > float(st.no_power_acceptance)
        p_np = p.cpu().numpy()
        for seed in st.seeds:
            for rule in SAMPLING_RULES:
                g = torch.Generator(device=p.device).manual_seed(int(seed))
                draws = first_token_draws(p, q, n, rule, g)
                counts = np.bincount(draws.cpu().numpy(), minlength=p.shape[0])
                res = chi_square_top(counts, p_np, int(st.top_tokens))
                rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, "seed": int(seed),
                             "rule": rule, "draws": n, "temperature": sampling.temperature,
                             "top_k": sampling.top_k, "top_p": sampling.top_p, "statistic": res.statistic,
                             "pvalue": res.pvalue, "dof": res.dof, "total_variation": tv,
                             "expected_acceptance": expected_acc, "no_power": no_power,
                             "rejected": res.pvalue < alpha_level})
    df = pd.DataFrame(rows)
    metrics, summary = {}, []
    powered = df[~df.no_power]
    for rule in SAMPLING_RULES:
        sub = powered[powered.rule == rule]
        metrics[f"rejection_rate.{rule}"] = sub.rejected.mean() if len(sub) else float("nan")
        summary.append(f"  rule {rule:16s} rejected at p<{alpha_level} in {int(sub.rejected.sum())} of {len(sub)} "
                       f"tests with power (min p-value {sub.pvalue.min() if len(sub) else float('nan'):.3g})")
    metrics["no_power_contexts"] = int(df[df.rule == "correct"].drop_duplicates("prompt_id").no_power.sum())
    summary.insert(0, f"{len(ctx.prompts)} contexts x {len(st.seeds)} seeds x {n} draws; "
                      f"{metrics['no_power_contexts']} contexts have no power (expected acceptance > "
                      f"{st.no_power_acceptance}); TV(p, q) {df.total_variation.min():.2f}..{df.total_variation.max():.2f}")
    return StageOutput(df, metrics, summary)
