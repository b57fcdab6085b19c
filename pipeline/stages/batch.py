"""Stage batch: where speculation stops paying as the batch grows.

Two measurements in one job: the target's (and draft's) pass time over B rows x n new tokens (where
the flatness of the pass ends), and batched plain vs batched speculative throughput (tokens/s summed
over rows) at each batch size B and k (with an adaptive k policy: the k each run starts at), in adjacent
runs whose order rotates. The speculative arm uses the job's drafter and k policy. Rows of a batch are
consecutive prompts of the selection (wrapping around when B exceeds it).
Same concept, other floors: ``analysis/batch.py``, ``speclab/decoding/batch.py``.
"""
from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.jobs.context import StageContext
from store.records import make_schema
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, identity, rotated, INTERVAL_NOTE, min_runs, speedup_metrics, speedup_text
from pipeline.jobs.context import generator, memory_columns, sampling_config
from pipeline.jobs.run_names import run_name
from speclab.specs.arms import OWN, PLAIN, Arm, Job, expand_all
from speclab.decoding.batch import BatchResult, batch_plain_generate, batch_speculative_generate
from speclab.measures.step_costs import pass_times

log = logging.getLogger(__name__)
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("measure", "string"),  # "pass": a pass time; "run": a batched generation run
    ("round", "int32"), ("rotation", "int32"), ("batch_size", "int32"), ("model", "string"),
    ("pass_len", "int32"), ("median_s", "float64"), ("q25_s", "float64"), ("q75_s", "float64"),
    ("samples", "int32"), ("context_len", "int32"),
    ("block", "int32"), ("prompt_ids", "string"), ("kinds", "string"), ("arm", "string"), ("position", "int32"),
    ("k", "int32"), ("do_sample", "bool"), ("new_tokens", "int64"), ("wall_s", "float64"), ("prefill_s", "float64"),
    ("tokens_per_s", "float64"), ("ratio_to_adjacent_plain", "float64"), ("acceptance_rate", "float64"),
    ("row_acceptance", "string"), ("iterations", "int32"), ("draft_s_per_iter", "float64"),
    ("verify_s_per_iter", "float64"), ("rollback_s_per_iter", "float64"), ("layout_s_per_iter", "float64"),
    ("iter_s", "float64"), ("layout_share", "float64"), ("masked_share", "float64"), ("dummy_share", "float64"),
    ("identical_to_plain", "bool"), ("merged_prefill", "bool"),
] + MEMORY_FIELDS + TRUST_FIELDS)


def _pass_rows(ctx: StageContext) -> list[dict]:
    """Target and draft pass times for every batch size and pass length, after the first prompt."""
    st, ids = ctx.cfg.stage, ctx.inputs[ctx.prompts[0].id]
    rows = []
    for b in [int(x) for x in st.batch_sizes]:
        for role, model, lengths in (("target", ctx.pair.target, [int(n) for n in st.pass_lengths]),
                                     ("draft", ctx.pair.draft, [1])):
            mem = memory_columns(ctx)
            for t in pass_times(model, ids, lengths, int(st.timing_repeats), int(st.timing_warmup),
                                f"batch pass times B={b} {role}", batch_size=b):
                rows.append({"measure": "pass", "batch_size": b, "model": role, "pass_len": t.pass_len,
                             "median_s": t.median_s, "q25_s": t.q25_s, "q75_s": t.q75_s, "samples": t.samples,
                             "context_len": int(ids.shape[1]), **mem})
    return rows


def _run_columns(res: BatchResult) -> dict:
    its = res.iterations
    n = len(its)
    per = (lambda attr: sum(getattr(i, attr) for i in its) / n) if n else (lambda attr: float("nan"))
    total = sum(i.total_s for i in its)
    layout = sum(i.layout_s for i in its)  # masks and positions, per-row rollback, row drops and re-packing
    fed = sum(i.rows * (i.k + 1) for i in its)
    return {"new_tokens": res.total_tokens, "wall_s": res.wall_s, "prefill_s": res.prefill_s,
            "tokens_per_s": res.tokens_per_s, "acceptance_rate": res.acceptance_rate,
            "row_acceptance": json.dumps([round(a, 4) if a == a else None for a in res.row_acceptance_rates]),
            "iterations": n, "draft_s_per_iter": per("draft_s"), "verify_s_per_iter": per("verify_s"),
            "rollback_s_per_iter": per("rollback_s"), "layout_s_per_iter": layout / n if n else float("nan"),
            "iter_s": total / n if n else float("nan"),
            # Bookkeeping of the ragged layout over iteration time.
            "layout_share": layout / total if total > 0 else float("nan"),
            "masked_share": float(np.mean([i.masked_share for i in its])) if n else float("nan"),
            "dummy_share": sum(i.dummy_inputs for i in its) / fed if fed else float("nan")}


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    sampling, gen = sampling_config(cfg), generator(ctx)
    n_new = int(cfg.max_new_tokens)
    log.info(f"batch: pass times over B x n new tokens (B = {list(st.batch_sizes)})")
    rows = [{**identity(ctx), "round": int(cfg.round), "rotation": int(cfg.rotation), **r} for r in _pass_rows(ctx)]
    # Plain and the job's drafter and k policy at each k (the speed stage's default arms).
    job = Job(str(cfg.drafter.name), str(cfg.k_policy.name), tuple(int(k) for k in st.ks), int(cfg.k))
    arms = expand_all([OWN], job)
    order_base = [int(b) for b in st.batch_sizes]
    prompts = ctx.prompts
    # Warm-up: one small batch through every arm (first calls allocate and pick kernels).
    for arm in arms:
        _generate(ctx, arm, [ctx.inputs[p.id] for p in prompts[:2]], min(n_new, 8), sampling, gen)
    block = 0
    for r in range(int(st.rounds)):
        for b in order_base:
            starts = range(0, len(prompts), b) if b <= len(prompts) else [0]
            for s in tqdm(starts, desc=f"batch B={b} round {r}", leave=False):
                ctx.load.sample()  # between blocks: the machine's load while the runs are timed
                group = [prompts[(s + i) % len(prompts)] for i in range(b)]
                ids = [ctx.inputs[p.id] for p in group]
                order = rotated(arms, cfg, block)
                results = {a: _generate(ctx, a, ids, n_new, sampling, gen) for a in order}
                plain = results[PLAIN]
                mem = memory_columns(ctx)
                for a in order:
                    res = results[a]
                    rows.append({**identity(ctx), "measure": "run", "round": int(cfg.round) + r,
                                 "rotation": int(cfg.rotation), "batch_size": b, "block": block,
                                 "prompt_ids": ",".join(p.id for p in group),
                                 "kinds": ",".join(sorted({p.kind for p in group})), "arm": a.method,
                                 "position": order.index(a), "k": a.columns()["k"], "do_sample": sampling.do_sample,
                                 "context_len": int(max(x.shape[-1] for x in ids)),
                                 **_run_columns(res), "ratio_to_adjacent_plain": res.tokens_per_s / plain.tokens_per_s,
                                 "identical_to_plain": res.tokens == plain.tokens,
                                 "merged_prefill": a != PLAIN and bool(cfg.merge_prefill), **mem})
                block += 1
    df = pd.DataFrame(rows, columns=SCHEMA.names)
    return summarize(df, cfg)


def _generate(ctx: StageContext, arm: Arm, ids: list, n_new: int, sampling, gen) -> BatchResult:
    pair = ctx.pair
    if arm == PLAIN:
        return batch_plain_generate(pair.target, ids, n_new, sampling, pair.eos_token_id, gen)
    s = ctx.strategy(arm.k, arm.drafter, arm.k_policy)  # a new drafter and k policy for each run
    return batch_speculative_generate(pair.target, s.drafter, ids, n_new, s.policy, sampling, pair.eos_token_id, gen,
                                      merge_prefill=bool(ctx.cfg.merge_prefill))


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "batch")


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Per (B, k): speed-up over the adjacent batched plain run, throughput, alpha, layout overhead (child runs)."""
    runs, passes = df[df.measure == "run"], df[df.measure == "pass"]
    arms, summary = [], []
    tgt = passes[passes.model == "target"].set_index(["batch_size", "pass_len"]).median_s
    for b, at_b in runs.groupby("batch_size", sort=True):
        b = int(b)
        plain = at_b[at_b.arm == "plain"]
        flat = tgt.loc[b] / tgt.loc[(b, 1)] if (b, 1) in tgt.index else None
        summary.append(f"B={b}: plain {plain.tokens_per_s.median():.1f} tok/s (summed over rows)"
                       + ("; target pass over n new tokens / one token: "
                          + ", ".join(f"{int(n)}: {v:.2f}" for n, v in flat.items()) if flat is not None else ""))
        for k, sub in at_b[at_b.arm == "speculative"].groupby("k", sort=True):
            k = int(k)
            m = {**speedup_metrics(sub, plain, min_runs(cfg)), "alpha": sub.acceptance_rate.mean(),
                 "layout_share": sub.layout_share.median(), "masked_share": sub.masked_share.median(),
                 "dummy_share": sub.dummy_share.median(), "identical_share": sub.identical_to_plain.mean(),
                 "draft_ms_per_iter": 1e3 * sub.draft_s_per_iter.mean(),
                 "verify_ms_per_iter": 1e3 * sub.verify_s_per_iter.mean(), "runs": len(sub)}
            arms.append(ArmResult(f"B{b} k{k}", {"batch_size": int(b), "k": int(k), "kind": "all"}, m))
            summary.append(f"  k={k}: {speedup_text(m)}, alpha {m['alpha']:.2f}, layout overhead "
                           f"{100 * m['layout_share']:.1f}% of iteration time, masked share {100 * m['masked_share']:.1f}%, rows identical to batched plain "
                           f"{m['identical_share']:.0%}")
    spec = runs[runs.arm == "speculative"]
    metrics = {"identical_share": spec.identical_to_plain.mean() if len(spec) else float("nan"),
               "max_layout_share": spec.layout_share.max() if len(spec) else float("nan"),
               "batch_sizes": float(runs.batch_size.nunique())}
    return StageOutput(df, metrics, summary + [INTERVAL_NOTE], arms)
