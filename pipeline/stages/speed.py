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

from pipeline.jobs.context import StageContext
from pipeline.engines.base import BLOCK_STEP_FIELDS, DEFAULT_ENGINE, ITERATION_TIMES, engine_class, engine_of
from pipeline.jobs.arms import engine_name, stage_entries
from pipeline.jobs.inputs import latest_plan_file
from pipeline.jobs.stage_output import ArmResult, StageOutput, by_kind, single_arm_metrics
from pipeline.stages.speed_race import FIXED, Race
from pipeline.stages.shared import IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, identity, rotated, DEFAULT_LEVEL, min_runs, speedup_metrics, speedup_text
from pipeline.jobs.context import generator, sampling_config, stage_ks
from pipeline.jobs.run_names import ks_label, run_name
from speclab.specs.arms import PLAIN, RECOMMENDED, Arm, needs
from speclab.specs.tree_shapes import is_tree
from store.plan_check import kind_checks, track_record
from store.records import make_schema

log = logging.getLogger(__name__)
STEP_FIELDS = [f"{name}_{when}_s" for when in ("before", "after") for name in ("target_step", "draft_step", "verify")]
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
    ("stopped_by", "string"),
] + [(f, "float64") for f in STEP_FIELDS + BLOCK_STEP_FIELDS] + MEMORY_FIELDS + TRUST_FIELDS)


def resolve(arm: Arm, kind: str, plan: dict[str, Arm] | None) -> Arm:
    """The configuration an arm runs for a prompt of this kind (the plan's choice for the recommended arm)."""
    if arm != RECOMMENDED:
        return arm
    assert plan is not None
    return plan.get(kind) or plan["all"]


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    ks, sampling = stage_ks(cfg), sampling_config(cfg)
    engine = engine_of(ctx)  # who runs the arms (conf/engine/; pipeline/engines/base.py)
    names = engine.arms(ctx, ks)
    plan = latest_plan(ctx.cfg) if RECOMMENDED in names else None
    runs = [*names, *(plan or {}).values()]
    gen = generator(ctx)
    engine.prepare(ctx, runs)  # what the arms (the job's or the plan's) need measured before the runs
    warm = engine.warm_arms(names)
    log.info(f"speed: warm-up ({', '.join(a.label if a.method != 'plain' else 'plain' for a in warm)} on one prompt)")
    first = ctx.prompts[0]
    for arm in tqdm(list(dict.fromkeys(resolve(a, first.kind, plan) for a in warm)), desc="speed warm-up", leave=False):
        engine.run(ctx, arm, ctx.inputs[first.id], gen)
    arm_ks = sorted({arm.k for arm in runs if arm.k and not arm.is_tree})
    log.info(f"speed: step and pass times before the runs (k = {arm_ks}, {st.timing_repeats} repeats)")
    before = engine.step_times(ctx, arm_ks, "step times before")
    race = Race(names, PLAIN, kind_counts(ctx), int(st.rounds), bool(st.race), st.precision,
                float(st.interval_level), st.budget_minutes, lambda arm, kind: arm_name(resolve(arm, kind, plan)))
    rows, block = [], 0
    # One bar over the whole budget (every round's blocks): its time left is the job's at most; a kind the race
    # stopped skips its blocks, so the bar jumps ahead.
    progress = tqdm(total=int(st.rounds) * len(ctx.prompts), desc=f"speed {len(names)} arms, budget {int(st.rounds)} "
                                                                 f"rounds", unit="block", leave=False)
    for r in range(int(st.rounds)):
        for prompt in ctx.prompts:
            running = race.arms_for(prompt.kind)
            if not running:
                progress.update(1)
                continue
            ctx.load.sample()  # between blocks: the machine's load while the runs are timed
            order = rotated(running, cfg, block)
            ids = ctx.inputs[prompt.id]
            now = engine.block_step_times(ctx, ids)
            results = {arm: engine.run(ctx, resolve(arm, prompt.kind, plan), ids, gen) for arm in order}
            plain_tokens, plain_wall = results[PLAIN][:2]
            plain_tps = len(plain_tokens) / plain_wall
            mem = engine.memory(ctx)
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
                             "identical_to_plain": toks == plain_tokens, **extra, **now, **mem, "_arm": arm})
            for line in race.record(prompt.kind, {arm: len(results[arm][0]) / results[arm][1] / plain_tps
                                                  for arm in order}):
                log.info(line)
            block += 1
            progress.update(1)
    progress.close()
    race.finish()
    for row in rows:
        row["stopped_by"] = race.stopped_by(row["kind"], row.pop("_arm"))
    log.info("speed: step and pass times after the runs (drift check)")
    after = engine.step_times(ctx, arm_ks, "step times after")
    df = pd.DataFrame(rows)
    for when, (t_step, d_step, verify) in (("before", before), ("after", after)):
        df[f"target_step_{when}_s"] = t_step
        df[f"draft_step_{when}_s"] = d_step
        # NaN for plain rows and trees (a tree's pass is wider than its depth + 1: stage timing's tree_nodes)
        df[f"verify_{when}_s"] = df.k.map(verify).astype(float).where(~df.drafter.map(is_tree), float("nan"))
    return summarize(df, cfg)


def arm_name(arm: Arm) -> str:
    """An arm as the race names it (the plan's arm resolved for a kind: ``prompt lookup k=4 (plan)``)."""
    return "plain" if arm == PLAIN else arm.label


def kind_counts(ctx: StageContext) -> dict[str, int]:
    """Each kind's number of prompts in this job, in the prompts' order."""
    return dict(Counter(p.kind for p in ctx.prompts))


def stopped_by(runs: pd.DataFrame) -> str:
    """Why these runs (one arm, one kind, or a kind's plain runs) stopped; "" for files written before racing."""
    if "stopped_by" not in runs or runs.stopped_by.isna().all():
        return ""
    return str(runs.stopped_by.dropna().iloc[-1])


def race_lines(df: pd.DataFrame) -> list[str]:
    """Per kind of a sequential run: its blocks and minutes, why it stopped, and the arms dropped on the way."""
    plain = df[df.arm == "plain"]
    if stopped_by(plain) in ("", FIXED):
        return []
    out = []
    for kind, p in plain.groupby("kind", sort=False):
        runs = df[df.kind == kind]
        gone = sorted({arm_label(r) for r in runs[runs.stopped_by.str.startswith("dropped")].itertuples()})
        out.append(f"{kind}: {p.block.nunique()} blocks, {runs.wall_s.sum() / 60:.1f} min, stopped by "
                   f"{stopped_by(p)}" + (f"; dropped {', '.join(gone)}" if gone else ""))
    return out


def arm_label(row) -> str:
    return Arm.from_row(row).label


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
    return {str(r.kind): Arm("recommended", int(r.k) or None, str(r.k_policy), str(r.drafter), engine_name(cfg))
            for r in rec.itertuples()}


def engine_counts(runs: pd.DataFrame) -> dict[str, float]:
    """An engine's counters per request (mean_k is drafted per target pass; acceptance_rate accepted / drafted)."""
    drafted = runs.mean_k * runs.iterations
    return {"drafted_per_request": float(drafted.mean()),
            "accepted_per_request": float((drafted * runs.acceptance_rate.fillna(0.0)).mean())}


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline numbers of a speed result: per arm and kind (child runs), and for the job."""
    first = df.iloc[0]
    before = (first.target_step_before_s, first.draft_step_before_s)
    after = (first.target_step_after_s, first.draft_step_after_s)
    plain, spec = df[df.arm == "plain"], df[df.arm == "speculative"]
    level = float(OmegaConf.select(cfg, "stage.interval_level", default=DEFAULT_LEVEL))
    arms = []
    for (method, k, policy, drafter), sub in df[df.arm != "plain"].groupby(["arm", "k", "k_policy", "drafter"],
                                                                           sort=False):
        arm = Arm(method, int(k) or None, policy, drafter, str(sub.engine.iloc[0]) if "engine" in sub else DEFAULT_ENGINE)
        for kind, s in by_kind(sub):
            stopped = stopped_by(s)
            arms.append(ArmResult(
                arm.run_name(kind),
                {"arm": method, "k": int(k), "k_policy": policy, "drafter": drafter, "kind": kind,
                 "engine": str(s.engine.iloc[0]) if "engine" in s else DEFAULT_ENGINE,
                 "do_sample": bool(s.do_sample.iloc[0]), "temperature": float(s.temperature.iloc[0]),
                 "top_p": float(s.top_p.iloc[0]), **({"stopped_by": stopped} if stopped else {})},
                {**speedup_metrics(s, plain, min_runs(cfg), level), "alpha": s.acceptance_rate.mean(), "tokens_per_pass": s.tokens_per_pass.mean(),
                 **{f"{part}_ms_per_iter": 1e3 * s[f"{part}_s_per_iter"].mean()
                    for part in ITERATION_TIMES},
                 "mean_k": s.mean_k.mean(), "identical_share": s.identical_to_plain.mean(), "runs": len(s),
                 **({} if engine_class(arm.engine).counts_iterations else engine_counts(s)),
                 **({"tree_nodes": s.tree_nodes.mean()} if arm.is_tree else {})}, arm.label))
    drift = max(max(a / b, b / a) for a, b in zip(after, before))
    metrics = {"plain_tokens_per_s": plain.tokens_per_s.median(), "identical_share": spec.identical_to_plain.mean(),
               "drift_ratio": drift,
               "target_step_before_ms": 1e3 * before[0], "target_step_after_ms": 1e3 * after[0],
               "draft_step_before_ms": 1e3 * before[1], "draft_step_after_ms": 1e3 * after[1],
               "blocks": float(df.block.nunique()), "minutes": df.wall_s.sum() / 60, "level": level,
               **single_arm_metrics([a for a in arms if a.params["kind"] == "all"] or arms)}
    summary = [f"plain {metrics['plain_tokens_per_s']:.1f} tok/s (median); speculative outputs identical "
               f"to the adjacent plain run in {int(spec.identical_to_plain.sum())} of {len(spec)} runs",
               f"step times before/after: target {1e3 * before[0]:.1f}/{1e3 * after[0]:.1f} ms, "
               f"draft {1e3 * before[1]:.1f}/{1e3 * after[1]:.1f} ms (drift x{drift:.2f})"]
    summary += race_lines(df)
    for arm in arms:
        m = arm.metrics
        if m.get("drafted_per_request") is not None:  # an engine that counts per request, not per iteration part
            parts = (f"per request {m['drafted_per_request']:.1f} drafted, {m['accepted_per_request']:.1f} accepted "
                     f"(the engine's counters)")
        else:
            parts = (f"per iteration draft {m['draft_ms_per_iter']:.1f} ms, verify {m['verify_ms_per_iter']:.1f} ms, "
                     f"rollback {m['rollback_ms_per_iter']:.2f} ms, bookkeeping {m['bookkeeping_ms_per_iter']:.2f} ms")
        summary.append(f"{arm.name}: {speedup_text(m)}, alpha {m['alpha']:.2f}, "
                       f"{m['spec_tokens_per_s']:.1f} vs {m['plain_tokens_per_s']:.1f} tok/s; {parts}")
    if (df.arm == RECOMMENDED.method).any():
        checked, lines = plan_check(df, cfg)
        metrics.update(checked)
        summary += lines
    return StageOutput(df, metrics, summary, arms)


def plan_check(df: pd.DataFrame, cfg: DictConfig) -> tuple[dict[str, float], list[str]]:
    """A check job closes the plan's loop on its own run: per kind, the recommendation's speed-up measured on the
    prompts the plan did not see against the plan's interval for an unseen prompt, and against the best other arm
    of the same blocks (``store.plan_check``); none where the plan file is gone."""
    path = latest_plan_file(cfg)
    if path is None or not path.exists():
        return {}, []
    checks = kind_checks(df, pd.read_parquet(path))
    checks = checks[checks.prompts_checked > 0]
    metrics, lines = {}, []
    for r in checks.itertuples():
        inside = "" if r.measured_inside != r.measured_inside else \
            " inside" if r.measured_inside else " outside"
        metrics.update({f"plan_measured_{r.kind}": r.measured, f"plan_vs_best_{r.kind}": r.vs_best,
                        **({f"plan_inside_{r.kind}": float(r.measured_inside)} if inside else {})})
        lines.append(f"plan check {r.kind}: {r.choice} measured {r.measured:.2f} on {r.prompts_checked} unseen prompts, "
                     f"predicted {r.predicted:.2f}, {inside.strip() or 'no'} interval for an unseen prompt "
                     f"{r.unseen_lo:.2f}-{r.unseen_hi:.2f}; {r.vs_best:.2f} of {r.best_arm} "
                     + (f"({r.vs_best_lo:.2f}-{r.vs_best_hi:.2f})" if r.vs_best_lo == r.vs_best_lo else "(no interval)"))
    record = track_record(checks)
    if record["checks"]:
        metrics.update({"plan_inside_share": record["inside_share"], "plan_holds_share": record["holds_share"]})
    return metrics, lines
