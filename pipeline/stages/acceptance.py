"""Stage acceptance: every configuration of the job on every prompt, as its engine runs it (``Engine.acceptance_runs``):
one row per iteration of a loop that counts them (speclab's), else one row per request (drafted, accepted).
Same concept, other floor: ``speclab/decoding/acceptance.py``."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from pipeline.jobs.context import StageContext
from pipeline.engines.base import RequestResult, by_position, engine_class, engine_of, rows_engine
from pipeline.stages.plan_sample import grow_sample, grows
from store.records import make_schema
from pipeline.jobs.stage_output import ArmResult, StageOutput, by_kind, single_arm_metrics
from pipeline.stages.shared import IDENTITY_FIELDS, TRUST_FIELDS, identity
from pipeline.jobs.context import generator, sampling_config, stage_ks
from pipeline.jobs.run_names import ks_label, run_name
from speclab.decoding.acceptance import alpha_hat
from speclab.specs.arms import Arm
from speclab.costs.cost_model import expected_tokens_per_iteration

SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("k", "int32"), ("drafter", "string"), ("k_policy", "string"),
    ("do_sample", "bool"), ("temperature", "float64"), ("top_k", "int32"), ("top_p", "float64"),
    ("iteration", "int32"), ("proposed", "int32"), ("accepted", "int32"), ("bonus", "bool"), ("new_tokens", "int32"),
    # What a time model replays (speclab.costs.time_model): the context of each iteration, the draft model's
    # catch-up and calls, and the loop's own times (the run's prefill and wall time repeat on its rows).
    ("prompt_len", "int32"), ("length", "int32"), ("draft_fed", "int32"), ("draft_calls", "int32"),
    ("draft_s", "float64"), ("verify_s", "float64"), ("rollback_s", "float64"), ("total_s", "float64"),
    ("prefill_s", "float64"), ("wall_s", "float64"), ("with_prompt", "bool"),
    # stage.replay (greedy): rows replayed from one plain generation and one stepwise draft pass
    # (speclab.drafting.replay; no times), and on the one configuration each prompt also runs for real, whether
    # the replay's iteration equals the loop's (1/0; NaN where not compared).
    ("replayed", "bool"), ("replay_agrees", "float64"),
    # A tree configuration (stage.trees, drafter tree:<spec>; k and proposed: its depth): the nodes its target
    # pass checked, and the mean width of its draft model's calls after the first (a chain's: 1).
    ("tree_nodes", "float64"), ("draft_call_width", "float64"),
    # An engine counted per request: its accepted proposals per draft position, comma-separated ('' where the
    # engine does not count them; a loop's rows count them per iteration: accepted).
    ("accepted_by_depth", "string"),
] + TRUST_FIELDS)


def position_acceptance(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """Per draft position i (0-based): conditional P(i accepted | i reached) and cumulative P(i accepted).

    Only iterations that proposed the full k count. The bonus token is not a draft position:
    it is reported separately as the share of iterations that accepted all k.
    """
    full = df[df.proposed == k]
    acc = full.accepted.to_numpy()
    rows = []
    for i in range(k):
        reached = (acc >= i).sum()
        rows.append({"position": i, "conditional": (acc > i).sum() / reached if reached else np.nan,
                     "cumulative": (acc > i).mean() if len(acc) else np.nan})
    return pd.DataFrame(rows)


def alpha(df: pd.DataFrame) -> float:
    return alpha_hat(df.accepted, df.proposed)


def proposal_efficiency(df: pd.DataFrame) -> float:
    return df.accepted.sum() / df.proposed.sum() if df.proposed.sum() else float("nan")


def run(ctx: StageContext) -> StageOutput:
    began = time.monotonic()
    df = pd.DataFrame(rows_of(ctx, ctx.prompts), columns=SCHEMA.names)
    if grows(ctx.cfg):  # a plan's sample, grown a kind at a time until each kind is settled or the budget spent
        df = grow_sample(ctx, df, lambda more: pd.DataFrame(rows_of(ctx, more), columns=SCHEMA.names),
                         (time.monotonic() - began) / len(ctx.prompts))
    return summarize(df, ctx.cfg)


def rows_of(ctx: StageContext, prompts: list) -> list[dict]:
    """The rows of every configuration's run on ``prompts``, as the job's engine runs them
    (``Engine.acceptance_runs``): one per iteration of a loop that counts them, else one per request."""
    cfg = ctx.cfg
    sampling, gen = sampling_config(cfg), generator(ctx)
    rows = []
    for run in engine_of(ctx).acceptance_runs(ctx, prompts, stage_ks(cfg, "acceptance_ks"), gen):
        common = {**identity(ctx), "prompt_id": run.prompt.id, "kind": run.prompt.kind, **run.arm,
                  "do_sample": sampling.do_sample, "temperature": sampling.temperature, "top_k": sampling.top_k,
                  "top_p": sampling.top_p, "prompt_len": run.prompt_len}
        own = run.iterations if run.iterations is not None else [request_row(run.result, run.prompt_len)]
        rows += [{**common, **it} for it in own]
    return rows


def request_row(r: RequestResult, prompt_len: int) -> dict:
    """A request's row (an engine that counts per request): proposed = drafted, accepted; draft_calls = the
    target's passes after the prompt; its iterations' parts are not timed (NaN)."""
    nan = float("nan")
    return {"iteration": 0, "proposed": r.drafted, "accepted": r.accepted, "bonus": False, "new_tokens": len(r.tokens),
            "length": prompt_len + len(r.tokens), "draft_fed": 0, "draft_calls": r.iterations, "draft_s": nan,
            "verify_s": nan, "rollback_s": nan, "total_s": r.decode_s, "prefill_s": r.prompt_s, "wall_s": r.wall_s,
            "with_prompt": False, "replayed": False, "replay_agrees": nan, "tree_nodes": 0.0, "draft_call_width": nan,
            "accepted_by_depth": by_position(r.accepted_per_pos)}


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "acceptance", [ks_label(stage_ks(cfg, "acceptance_ks"))])


def depth_counts(rows: pd.DataFrame) -> list[int]:
    """Accepted proposals per draft position summed over an engine's request rows (empty where it does not count
    them)."""
    if "accepted_by_depth" not in rows:
        return []
    out: list[int] = []
    for text in rows.accepted_by_depth.fillna(""):
        for i, c in enumerate(int(x) for x in str(text).split(",") if x != ""):
            out += [0] * (i + 1 - len(out))
            out[i] += c
    return out


def engine_summarize(df: pd.DataFrame) -> StageOutput:
    """An engine's per-request rows (one per request, ``Engine.counts_iterations`` false): alpha = accepted / drafted
    per configuration and kind, the tokens per target pass, and where the engine counts them the accepted per draft
    position (``accept_pos<i>``: position i accepted given position i - 1 was, from i = 1)."""
    arms, summary = [], []
    for (k, drafter, policy), conf in df.groupby(["k", "drafter", "k_policy"], sort=True):
        first = conf.iloc[0]
        label = Arm("speculative", int(k) or None, str(policy), str(drafter), str(first.engine)).label
        for kind, sub in by_kind(conf):
            arms.append(ArmResult(
                f"{label} {kind}",
                {"k": int(k), "kind": kind, "drafter": drafter, "k_policy": policy, "engine": str(first.engine),
                 "do_sample": bool(first.do_sample), "temperature": float(first.temperature),
                 "top_k": int(first.top_k), "top_p": float(first.top_p)},
                {"alpha": proposal_efficiency(sub), "proposal_efficiency": proposal_efficiency(sub),
                 "tokens_per_pass": passes_rate(sub, "new_tokens"), "drafted_per_pass": passes_rate(sub, "proposed"),
                 "iterations": int(sub.draft_calls.sum()), "requests": len(sub), "prompts": sub.prompt_id.nunique(),
                 **{f"accept_pos{i}": c / prev if prev else float("nan")
                    for i, (prev, c) in enumerate(zip(depth_counts(sub), depth_counts(sub)[1:]), start=1)}}))
        pooled = arms[-1].metrics
        summary.append(f"{first.engine} {label}: alpha {pooled['alpha']:.3f} (accepted/drafted, "
                       f"{int(conf.accepted.sum())}/{int(conf.proposed.sum())}); {pooled['drafted_per_pass']:.2f} "
                       f"drafted and {pooled['tokens_per_pass']:.2f} tokens per target pass, {len(conf)} requests")
        summary += kind_lines(conf, proposal_efficiency)
        depths = depth_counts(conf)
        if depths:
            summary.append("  accepted by draft position: " + ", ".join(f"{i}: {c}" for i, c in enumerate(depths)))
    metrics = {"alpha_all_k": proposal_efficiency(df), "iterations": int(df.draft_calls.sum()), "requests": len(df),
               **single_arm_metrics([a for a in arms if a.params["kind"] == "all"] or arms)}
    return StageOutput(df, metrics, summary, arms)


DETAILED_CONFIGS = 2  # a job of more configurations prints one line each (per kind and position: file, MLflow)


def kind_lines(rows: pd.DataFrame, rate) -> list[str]:
    """One summary line per kind: ``rate`` of its rows and of each of its prompts."""
    lines = []
    for kind, sub in rows.groupby("kind", sort=False):
        per_prompt = ", ".join(f"{pid} {rate(s):.2f}" for pid, s in sub.groupby("prompt_id", sort=False))
        lines.append(f"  {kind:10s} alpha {rate(sub):.3f} (per prompt: {per_prompt})")
    return lines


def passes_rate(df: pd.DataFrame, column: str) -> float:
    """``column`` summed per target pass (draft_calls on an engine's rows)."""
    passes = df.draft_calls.sum()
    return float(df[column].sum() / passes) if passes else float("nan")


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline numbers of an acceptance result: per k and kind (child runs), and for the job."""
    if len(df) and not engine_class(rows_engine(df)).counts_iterations:
        return engine_summarize(df)
    arms, summary = [], []
    configs = df.groupby(["k", "drafter", "k_policy"], sort=True)
    detailed = configs.ngroups <= DETAILED_CONFIGS
    for (k, drafter, policy), at_k in configs:
        first = at_k.iloc[0]
        for kind, sub in by_kind(at_k):
            a = alpha(sub)
            arms.append(ArmResult(
                " ".join([f"k{k}", *([policy] if policy != "fixed" else []),
                          *([drafter] if drafter != "model" else []), kind]),
                {"k": int(k), "kind": kind, "drafter": drafter, "k_policy": policy,
                 "do_sample": bool(first.do_sample), "temperature": float(first.temperature),
                 "top_k": int(first.top_k), "top_p": float(first.top_p)},
                {"alpha": a, "tokens_per_pass": sub.new_tokens.mean(),
                 "tokens_per_pass_formula": expected_tokens_per_iteration(a, int(k)),
                 "bonus_rate": sub[sub.proposed == k].bonus.mean(), "proposal_efficiency": proposal_efficiency(sub),
                 "iterations": len(sub), "prompts": sub.prompt_id.nunique(),
                 **{f"accept_pos{r.position}": r.conditional for r in position_acceptance(sub, int(k)).itertuples()}}))
        pooled = arms[-1].metrics
        what = "".join(f" {x}" for x, plain in ((drafter, "model"), (policy, "fixed")) if x != plain)
        if not detailed:  # a grid (the planner's): one line per configuration; the rest is in the file and MLflow
            kinds = ", ".join(f"{kind} {alpha(sub):.2f}" for kind, sub in at_k.groupby("kind", sort=False))
            summary.append(f"k={k}{what}: alpha {pooled['alpha']:.3f} ({kinds}); tokens per target pass "
                           f"{pooled['tokens_per_pass']:.2f} measured, {pooled['tokens_per_pass_formula']:.2f} formula")
            continue
        summary.append(f"k={k}{what}: pooled alpha {pooled['alpha']:.3f} (accepted/checked; accepted/proposed "
                       f"{pooled['proposal_efficiency']:.3f}); tokens per target pass {pooled['tokens_per_pass']:.2f} "
                       f"measured, {pooled['tokens_per_pass_formula']:.2f} from the formula")
        summary += kind_lines(at_k, alpha)
        pos = position_acceptance(at_k, int(k))
        reached = [r for r in pos.itertuples() if r.conditional == r.conditional]  # positions no draft got to: none
        summary.append("  by draft position (conditional / cumulative; the bonus token is not a position): "
                       + (", ".join(f"{r.position}: {r.conditional:.2f}/{r.cumulative:.2f}" for r in reached)
                          or "no position reached"))
    jobs_alpha = alpha(df)
    metrics = {"alpha_all_k": jobs_alpha, "iterations": len(df), **single_arm_metrics(
        [a for a in arms if a.params["kind"] == "all"] or arms)}
    if "replayed" in df and df.replayed.fillna(False).astype(bool).any():
        checked = df.replay_agrees.dropna()
        metrics.update(replayed_share=float(df.replayed.astype(bool).mean()), replay_checked=len(checked),
                       replay_mismatches=int((checked == 0).sum()))
        summary.append(f"replay: {100 * metrics['replayed_share']:.0f}% of the iterations replayed from one plain "
                       f"generation and one draft pass per prompt; on the configuration run for real, "
                       f"{metrics['replay_mismatches']} of {len(checked)} iterations differ from the replay "
                       "(an fp near-tie, or a dynamically quantized draft's multi-token catch-up call)")
    return StageOutput(df, metrics, summary, arms)
