"""Stage acceptance: the greedy (or sampling) loop over every prompt at k; one row per iteration.
Same concept, other floor: ``speclab/decoding/acceptance.py``."""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.config.strategy_config import drafter_class, drafter_conf
from pipeline.jobs.context import StageContext, job_k_max
from pipeline.engines.option_checks import on_llama
from pipeline.stages.plan_sample import grow_sample, grows
from pipeline.engines.tree_drafter import job_tree_drafter
from speclab.specs.tree_shapes import is_tree, parse_tree
from store.records import make_schema
from pipeline.jobs.stage_output import ArmResult, StageOutput, by_kind, single_arm_metrics
from pipeline.stages.shared import IDENTITY_FIELDS, identity
from pipeline.jobs.context import generator, sampling_config, stage_ks
from pipeline.jobs.run_names import ks_label, run_name
from speclab.decoding.acceptance import alpha_hat
from speclab.specs.arms import Arm
from speclab.costs.cost_model import expected_tokens_per_iteration
from speclab.decoding.loop import speculative_generate
from speclab.drafting.replay import Replay, replayable
from speclab.drafting.replay_check import differences, loop_iterations
from speclab.drafting.replay_reference import greedy_reference
from speclab.trees.tree_loop import tree_generate

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
])
log = logging.getLogger("speclab")
TIME_COLUMNS = ["draft_s", "verify_s", "rollback_s", "total_s", "prefill_s", "wall_s"]


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


def configurations(cfg: DictConfig) -> list[tuple[str, str, int]]:
    """(drafter, k policy, k) of every loop this job runs: each drafter at each k, then the extra
    adaptive policies (``stage.k_policies``, starting at the top-level k) with each of
    ``stage.policy_drafters`` (by default the job's own drafter)."""
    ks, policy = stage_ks(cfg, "acceptance_ks"), str(cfg.k_policy.name)
    drafters = [str(d) for d in cfg.stage.get("drafters") or [cfg.drafter.name]]
    extra = [str(p) for p in cfg.stage.get("k_policies") or [] if p != policy]
    with_policies = [str(d) for d in cfg.stage.get("policy_drafters") or [cfg.drafter.name]]
    trees = [(spec.drafter, "fixed", spec.depth) for spec in map(parse_tree, cfg.stage.get("trees") or [])]
    return ([(d, policy, k) for d in drafters for k in ks] + [(d, p, int(cfg.k)) for d in with_policies for p in extra]
            + trees)


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


def run(ctx: StageContext) -> StageOutput:
    began = time.monotonic()
    df = pd.DataFrame(rows_of(ctx, ctx.prompts), columns=SCHEMA.names)
    if grows(ctx.cfg):  # a plan's sample, grown a kind at a time until each kind is settled or the budget spent
        df = grow_sample(ctx, df, lambda more: pd.DataFrame(rows_of(ctx, more), columns=SCHEMA.names),
                         (time.monotonic() - began) / len(ctx.prompts))
    return summarize(df, ctx.cfg)


def rows_of(ctx: StageContext, prompts: list) -> list[dict]:
    """The rows of every configuration's run on ``prompts`` (llama.cpp: one request each)."""
    if on_llama(ctx):
        return engine_rows(ctx, prompts)
    cfg, pair = ctx.cfg, ctx.pair
    sampling = sampling_config(cfg)
    gen = generator(ctx)
    n_new, merged = int(cfg.max_new_tokens), bool(cfg.merge_prefill)
    confs = configurations(cfg)
    replay_on = replays(cfg, sampling)
    real = measured_configurations(cfg, confs) if replay_on else confs
    loop_only = set(unreplayable(cfg, confs)) if replay_on else set()
    line = (f"acceptance: the replay cannot reproduce drafter {', '.join(sorted(loop_only))} (its class declares "
            "no replay_as): its configurations run the loop")
    if loop_only and line not in ctx.said:  # once a job (a plan's growing sample comes back here)
        ctx.said.add(line)
        log.info(line)
    replay_on = replay_on and any(c[0] not in loop_only and not is_tree(c[0]) for c in confs)  # any to replay
    refs = {}
    if replay_on:  # one plain generation and one stepwise draft pass per prompt
        for prompt in tqdm(prompts, desc="acceptance: greedy references for the replay", leave=False):
            refs[prompt.id] = greedy_reference(pair.target, pair.draft, ctx.inputs[prompt.id], n_new, pair.eos_token_id,
                                               lookahead=job_k_max(cfg) + 1)
    rows = []
    for conf in [c for c in confs if c in real] + [c for c in confs if c not in real]:
        drafter_name, policy_name, k = conf
        for prompt in tqdm(prompts, desc=f"acceptance {drafter_name} {policy_name} k={k}", leave=False):
            ids = ctx.inputs[prompt.id]
            common = {**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, "k": k, "drafter": drafter_name,
                      "k_policy": policy_name, "do_sample": sampling.do_sample, "temperature": sampling.temperature,
                      "top_k": sampling.top_k, "top_p": sampling.top_p, "prompt_len": ids.shape[1]}
            if is_tree(drafter_name):  # never replayed: every tree run is real
                res = tree_generate(pair.target, job_tree_drafter(cfg, drafter_name, pair.draft), ids, n_new, sampling,
                                    pair.eos_token_id, gen, merge_prefill=merged)
                rows += loop_rows(res, common, [float("nan")] * len(res.iterations))
                continue
            s = ctx.strategy(k, drafter_name, policy_name)
            if conf not in real:
                rows += replay_rows(refs[prompt.id].replay(s.drafter, s.policy, merged), common)
                continue
            res = speculative_generate(pair.target, s.drafter, ids, n_new, k=s.policy, sampling=sampling,
                                       eos_token_id=pair.eos_token_id, generator=gen, merge_prefill=merged)
            agrees = [float("nan")] * len(res.iterations)
            # The same configuration replayed: where it differs (an fp near-tie), it is counted.
            if replay_on and drafter_name not in loop_only:
                fresh = ctx.strategy(k, drafter_name, policy_name)  # a policy's state starts anew
                agrees = iteration_agreement(refs[prompt.id].replay(fresh.drafter, fresh.policy, merged), res.iterations)
            rows += loop_rows(res, common, agrees)
    return rows


def engine_rows(ctx: StageContext, prompts: list) -> list[dict]:
    """llama.cpp's requests (engine=llama_cpp): one row per prompt and speculative configuration of
    ``engine.arms``, its counters as the server reports them (proposed: drafted, accepted; draft_calls: the
    target's passes after the prompt); it does not time its iterations' parts (NaN)."""
    cfg, runner = ctx.cfg, ctx.runner
    sampling, gen = sampling_config(cfg), generator(ctx)
    arms = [a for a in runner.arms(ctx, stage_ks(cfg, "acceptance_ks")) if a.method == "speculative"]
    nan = float("nan")
    rows = []
    for arm in arms:
        for prompt in tqdm(prompts, desc=f"acceptance llama.cpp {arm.label}", leave=False):
            ids = ctx.inputs[prompt.id]
            r = runner.request(ctx, arm, ids, gen)
            rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, **arm.columns(),
                         "do_sample": sampling.do_sample, "temperature": sampling.temperature,
                         "top_k": sampling.top_k, "top_p": sampling.top_p, "iteration": 0, "proposed": r.drafted,
                         "accepted": r.accepted, "bonus": False, "new_tokens": len(r.tokens),
                         "prompt_len": ids.shape[1], "length": ids.shape[1] + len(r.tokens), "draft_fed": 0,
                         "draft_calls": r.iterations, "draft_s": nan, "verify_s": nan, "rollback_s": nan,
                         "total_s": r.decode_s, "prefill_s": r.prompt_s, "wall_s": r.wall_s, "with_prompt": False,
                         "replayed": False, "replay_agrees": nan, "tree_nodes": 0.0, "draft_call_width": nan})
    return rows


def loop_rows(res, common: dict, agrees: list[float]) -> list[dict]:
    """A run's rows, one per iteration of the loop (chain or tree)."""
    return [{**common, "iteration": i, "proposed": it.k, "accepted": it.accepted, "bonus": it.bonus,
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


def replay_rows(rep: Replay, common: dict) -> list[dict]:
    """A replayed run's rows: the loop's counts, no times."""
    return [{**common, "iteration": i, "proposed": st.proposed, "accepted": st.accepted,
             "bonus": 0 < st.proposed == st.accepted, "new_tokens": st.new_tokens, "length": st.length,
             "draft_fed": st.draft_fed, "draft_calls": st.draft_calls, **dict.fromkeys(TIME_COLUMNS, float("nan")),
             "with_prompt": i == 0 and rep.merged, "replayed": True, "replay_agrees": float("nan"),
             "tree_nodes": 0.0, "draft_call_width": 1.0}
            for i, st in enumerate(rep.steps)]


def iteration_agreement(rep: Replay, iterations: list) -> list[float]:
    """1.0 where the replay's iteration i equals the loop's in every count, 0.0 where not."""
    return [float(not diff) for diff in differences(rep, loop_iterations(iterations))]


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "acceptance", [ks_label(stage_ks(cfg, "acceptance_ks"))])


def engine_summarize(df: pd.DataFrame) -> StageOutput:
    """An engine's per-request rows (llama.cpp): alpha = accepted / drafted per configuration and kind, and
    the tokens per target pass; per-position acceptance is not counted by the engine."""
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
                 "iterations": int(sub.draft_calls.sum()), "requests": len(sub), "prompts": sub.prompt_id.nunique()}))
        pooled = arms[-1].metrics
        summary.append(f"{first.engine} {label}: alpha {pooled['alpha']:.3f} (accepted/drafted, "
                       f"{int(conf.accepted.sum())}/{int(conf.proposed.sum())}); {pooled['drafted_per_pass']:.2f} "
                       f"drafted and {pooled['tokens_per_pass']:.2f} tokens per target pass, {len(conf)} requests")
        summary += kind_lines(conf, proposal_efficiency)
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
    if "engine" in df and len(df) and (df.engine != "speclab").all():
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
