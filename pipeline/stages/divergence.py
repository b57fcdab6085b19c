"""Stage divergence: where speculative greedy differs from plain greedy, is it a near-tie or a bug?
Same concept, other floor: ``speclab/measures/divergence.py``."""
from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig
import torch
from tqdm import tqdm

from pipeline.jobs.context import StageContext
from pipeline.engines.base import RequestResult, engine_of
from store.records import make_schema
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, identity
from pipeline.jobs.run_names import ks_label, run_name
from pipeline.jobs.context import stage_ks
from pipeline.config.stage_options import unused_note
from speclab.measures.divergence import classify, first_difference, recompute_logits
from speclab.specs.arms import PLAIN

WAYS = ("single_step", "verify_pass", "full_prefill")
TOP_N = 2  # an engine's probabilities asked at each new token: the top two, whose gap tells a near-tie
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("k", "int32"), ("round", "int32"), ("identical", "bool"),
    ("position", "int32"), ("plain_token", "int64"), ("spec_token", "int64"), ("plain_text", "string"),
    ("spec_text", "string"), ("top_logit", "float64"),
] + [(f"{col}_{way}", "float64") for way in WAYS for col in ("logit_plain", "logit_spec", "gap")] + [
    ("max_gap", "float64"), ("ulp", "float64"), ("gap_ulps", "float64"), ("classification", "string"),
])


def analyse(ctx: StageContext, ids: torch.Tensor, plain: list[int], spec: list[int], k: int) -> dict:
    """The divergence record for one plain/speculative output pair (identical outputs give a short record)."""
    pos = first_difference(plain, spec)
    if pos is None or pos >= min(len(plain), len(spec)):
        # Equal, or one stopped early at EOS with the rest equal: nothing to recompute.
        return {"identical": pos is None, "position": -1 if pos is None else pos, "classification": "identical"
                if pos is None else "length_only"}
    context = torch.cat([ids, torch.tensor([plain[:pos]], dtype=ids.dtype, device=ids.device)], dim=1)
    recs = recompute_logits(ctx.pair.target, context, plain[pos], spec[pos], verify_len=k + 1)
    verdict = classify(recs, ctx.pair.target.dtype, float(ctx.cfg.stage.tie_ulps))
    tok = ctx.pair.tokenizer
    row = {"identical": False, "position": pos, "plain_token": plain[pos], "spec_token": spec[pos],
           "plain_text": tok.decode([plain[pos]]) if tok else str(plain[pos]),
           "spec_text": tok.decode([spec[pos]]) if tok else str(spec[pos]),
           "top_logit": max(r.top_logit for r in recs), "max_gap": verdict.max_gap, "ulp": verdict.ulp,
           "gap_ulps": verdict.gap_ulps, "classification": "near_tie" if verdict.near_tie else "bug"}
    for r in recs:
        row.update({f"logit_plain_{r.way}": r.logit_plain, f"logit_spec_{r.way}": r.logit_spec,
                    f"gap_{r.way}": r.gap})
    return row


def engine_analyse(ctx: StageContext, ids: list[int], plain: RequestResult, spec: list[int], k: int) -> dict:
    """The divergence record of one plain/speculative pair of an engine that gives its own top probabilities
    (``Engine.top_probs``; not ``recomputes_logits``). At the first difference the engine's own
    top-2 log-probabilities of that next token, three ways: the plain run's (one-token steps; the prompt's pass
    at position 0), one pass over the last k + 1 tokens after the rest cached (a check's batch shape), one pass
    over the whole context. A log-probability differs from the logit by the same constant for every token, so
    each gap log(p_plain / p_spec) is the logit gap. A near-tie: the speculative token is the plain run's
    runner-up and the widest gap is within ``stage.tie_nats``, or a recomputation ranks it first."""
    pos = first_difference(plain.tokens, spec)
    if pos is None or pos >= min(len(plain.tokens), len(spec)):
        return {"identical": pos is None, "position": -1 if pos is None else pos, "classification": "identical"
                if pos is None else "length_only"}
    p_tok, s_tok = plain.tokens[pos], spec[pos]
    context = ids + plain.tokens[:pos]
    engine = engine_of(ctx)
    given = plain.top_probs[pos] if plain.top_probs and pos < len(plain.top_probs) else []
    ways = {"full_prefill" if pos == 0 else "single_step": given,
            "verify_pass": engine.top_probs(context, TOP_N, batch=k + 1) or [],
            **({} if pos == 0 else {"full_prefill": engine.top_probs(context, TOP_N) or []})}
    row = {"identical": False, "position": pos, "plain_token": p_tok, "spec_token": s_tok,
           "plain_text": token_text(ctx, p_tok), "spec_text": token_text(ctx, s_tok), "top_logit": float("nan"),
           "ulp": float("nan"), "gap_ulps": float("nan")}
    gaps, flipped = [], False
    for way, top in ways.items():
        logp = {t: math.log(p) for t, p in top if p > 0}
        lp, ls = logp.get(p_tok, float("nan")), logp.get(s_tok, float("nan"))
        row.update({f"logit_plain_{way}": lp, f"logit_spec_{way}": ls, f"gap_{way}": lp - ls})
        if not (math.isnan(lp) or math.isnan(ls)):
            gaps.append(abs(lp - ls))
        flipped |= bool(top) and top[0][0] == s_tok
    runner_up = len(given) > 1 and given[1][0] == s_tok
    (_, p1), *rest = given or [(None, float("nan"))]
    # the speculative token outside the plain run's top 2: the gap is at least the top-2 one
    row["max_gap"] = max(gaps) if gaps else (math.log(p1) - math.log(rest[0][1]) if rest else float("nan"))
    near = runner_up and (flipped or row["max_gap"] <= float(ctx.cfg.stage.tie_nats))
    row["classification"] = "near_tie" if near else "bug"
    return row


def token_text(ctx: StageContext, token: int) -> str:
    tok = ctx.pair.tokenizer
    return tok.decode([token]) if tok else str(token)


def run(ctx: StageContext) -> StageOutput:
    """Per round and prompt one plain greedy request (with each new token's top-2 probabilities where the engine does
    not recompute logits in torch) and per k one greedy request of the engine's speculative configuration at k;
    each pair's first difference explained by ``analyse`` (logits recomputed) or ``engine_analyse`` (top-2)."""
    cfg, engine = ctx.cfg, engine_of(ctx)
    own_logits = engine.recomputes_logits
    rows = []
    for r in range(int(cfg.stage.rounds)):
        for prompt in tqdm(ctx.prompts, desc=f"divergence round {r}", leave=False):
            ids = ctx.inputs[prompt.id]
            plain = engine.request(ctx, PLAIN, ids, greedy=True, n_probs=0 if own_logits else TOP_N)
            for k in stage_ks(cfg):
                spec = engine.request(ctx, engine.speculative_arm(ctx, k), ids, greedy=True).tokens
                why = (analyse(ctx, ids, plain.tokens, spec, k) if own_logits
                       else engine_analyse(ctx, ids[0].tolist(), plain, spec, k))
                rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, "k": k,
                             "round": int(cfg.round) + r, **why})
    return summarize(pd.DataFrame(rows, columns=SCHEMA.names), cfg)


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "divergence", [ks_label(stage_ks(cfg))])


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline metrics and summary lines of a divergence result (also used to log a run from its file)."""
    ks = sorted(int(k) for k in df.k.unique())
    diverged = df[~df.identical.astype(bool)]
    metrics = {"runs": len(df), "identical_share": df.identical.astype(bool).mean(),
               "divergences": len(diverged), "near_ties": int((diverged.classification == "near_tie").sum()),
               "bugs": int((diverged.classification == "bug").sum())}
    summary = [f"outputs identical in {int(df.identical.sum())} of {len(df)} runs (k in {ks}); "
               f"{metrics['near_ties']} near-ties, {metrics['bugs']} not explained by rounding"]
    for row in diverged.itertuples():
        where = (f"gap {row.max_gap:.4g} = {row.gap_ulps:.1f} ulp at top logit {row.top_logit:.2f}"
                 if row.gap_ulps == row.gap_ulps else  # an engine's own top-2 gives no ulps
                 f"gap {row.max_gap:.3f} nats in {row.engine}'s own top-2 log-probabilities "
                 f"(near-tie within {float(cfg.stage.tie_nats):g})")
        summary.append(f"  {row.prompt_id} k={row.k} token {row.position}: plain {row.plain_text!r} vs speculative "
                       f"{row.spec_text!r}, {where} -> {row.classification}")
    arms = []
    for k, sub in df.groupby("k", sort=True):
        div = sub[~sub.identical.astype(bool)]
        arms.append(ArmResult(f"k{k}", {"k": int(k), "kind": "all"},
                              {"runs": len(sub), "identical_share": sub.identical.astype(bool).mean(),
                               "divergences": len(div), "near_ties": int((div.classification == "near_tie").sum()),
                               "bugs": int((div.classification == "bug").sum())}))
    return StageOutput(df, metrics, summary + unused_note(cfg, "divergence"), arms)
