"""Stage load: speculation under a load of concurrent requests, in the engine's own server (or speclab's batched loop).

At each load (``stage.concurrency``: closed-loop clients, each sending its next request when its last is answered)
every configuration serves the same requests (the prompts in the job's order, a block starting where the last one
at that load ended), plain beside each speculative configuration in adjacent blocks whose order rotates, loads in an
order that rotates by round. Per request: the client's end-to-end latency, time to first token (the latency less the
server's own time after its first token), time per output token (that time over the tokens after the first), tokens,
drafted, accepted and target passes (the engine's counters). Per block: output tokens/s over its wall time.

At load 1 the plain requests are also run one at a time through the speed stage's ``run`` (``stage.speed_check``),
right after the block: the load generator's tokens/s against the speed stage's, adjacent.

Step and check times are taken before and after the blocks (the drift check, and the costs the analysis predicts
the gains from: analysis/load.py, speclab/costs/load_model.py). An engine that cannot serve a load says so in one
line, and the job goes on without that configuration at that load.
Same concept, other floors: ``engines/speclab/load.py``, ``analysis/load.py``.
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline.engines.base import LoadRefused, RequestResult, engine_of
from pipeline.engines.closed_loop import LoadRun, LoadStopped
from pipeline.jobs.context import StageContext, generator, stage_ks
from pipeline.jobs.run_names import run_name
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.stages.speed import arm_name
from pipeline.stages.shared import IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, identity, rotated
from speclab.specs.arms import PLAIN, RECOMMENDED, Arm
from speclab.stats.load_gains import block_gains, gain_interval, speed_check
from store.records import make_schema

log = logging.getLogger(__name__)
STEP_FIELDS = [f"{name}_{when}_s" for when in ("before", "after") for name in ("target_step", "draft_step", "verify")]
SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("measure", "string"),  # request: one request of a load; speed_run: the speed stage's run of a load-1 request
    ("round", "int32"), ("rotation", "int32"), ("block", "int32"), ("load", "int32"), ("arm", "string"),
    ("label", "string"), ("k", "int32"), ("drafter", "string"), ("k_policy", "string"), ("position", "int32"),
    ("request", "int32"), ("prompt_id", "string"), ("kind", "string"), ("client", "int32"),
    ("started_s", "float64"), ("ended_s", "float64"), ("latency_s", "float64"), ("ttft_s", "float64"),
    ("tpot_s", "float64"), ("prompt_s", "float64"), ("decode_s", "float64"), ("new_tokens", "int32"),
    ("drafted", "int64"), ("accepted", "int64"), ("passes", "int64"), ("identical_to_plain", "bool"),
    ("block_wall_s", "float64"), ("block_tokens_per_s", "float64"), ("most_in_flight", "int32"),
    ("stopped", "string"),
    # measure pass: the engine's pass over pass_len new tokens after the first prompt, one sequence (timing stage's)
    ("model", "string"), ("pass_len", "int32"), ("context_len", "int32"), ("median_s", "float64"),
    ("q25_s", "float64"), ("q75_s", "float64"), ("samples", "int32"),
] + [(f, "float64") for f in STEP_FIELDS] + MEMORY_FIELDS + TRUST_FIELDS)


def request_columns(r: RequestResult, latency_s: float) -> dict:
    """A request's timings and counters: TTFT = the client's latency less the server's own time after the first
    token (queueing, the prompt's pass and the transport); TPOT = that time over the tokens after the first."""
    n = len(r.tokens)
    decode = float(r.decode_s)
    return {"latency_s": latency_s, "ttft_s": latency_s - decode if decode == decode else np.nan,
            "tpot_s": decode / (n - 1) if n > 1 and decode == decode else np.nan, "prompt_s": float(r.prompt_s),
            "decode_s": decode, "new_tokens": n, "drafted": int(r.drafted), "accepted": int(r.accepted),
            "passes": int(r.iterations)}


def block_rows(run: LoadRun, prompts: list, plain_tokens: dict[int, list[int]] | None) -> list[dict]:
    """One row per answered request of a load run (``prompts``: each request index's prompt)."""
    tokens = sum(len(s.measured.tokens) for s in run.sent)
    tps = tokens / run.wall_s if run.wall_s > 0 else np.nan
    out = []
    for s in run.sent:
        r: RequestResult = s.measured
        same = plain_tokens.get(s.index) == r.tokens if plain_tokens is not None else True
        out.append({"request": s.index, "prompt_id": prompts[s.index].id, "kind": prompts[s.index].kind,
                    "client": s.client, "started_s": s.started_s, "ended_s": s.ended_s,
                    **request_columns(r, s.ended_s - s.started_s), "identical_to_plain": same,
                    "block_wall_s": run.wall_s, "block_tokens_per_s": tps, "most_in_flight": run.most_in_flight,
                    "stopped": run.stopped})
    return out


def interleaved(prompts: list) -> list:
    """The prompts with their kinds taken in turn (a, b, c, a, b, c, ...): every block of a few requests holds each
    kind, so a kind's gain is measured in every block."""
    kinds: dict[str, list] = {}
    for p in prompts:
        kinds.setdefault(p.kind, []).append(p)
    lists = list(kinds.values())
    return [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]


def block_prompts(ctx: StageContext, load: int, round_: int) -> list:
    """The prompts a block at ``load`` sends, in order: ``max(stage.requests, 2 x load)`` of the job's prompts (two
    requests a client at least: a client's second request starts while others are still decoding), kinds in turn,
    from where the same load's block of the last round ended (so rounds cover the prompts), wrapping around."""
    n = max(int(ctx.cfg.stage.requests), 2 * load)
    order = interleaved(ctx.prompts)
    start = (round_ * n) % len(order)
    return [order[(start + i) % len(order)] for i in range(n)]


def run(ctx: StageContext) -> StageOutput:
    cfg, st = ctx.cfg, ctx.cfg.stage
    engine = engine_of(ctx)
    arms = engine.arms(ctx, stage_ks(cfg))
    if RECOMMENDED in arms:
        raise LoadRefused("stage=load runs fixed configurations only: a load mixes kinds, and {method: recommended} "
                          "is a configuration per kind; give its choice as an entry of stage.arms")
    loads = [int(c) for c in st.concurrency]
    engine.prepare(ctx, arms)
    arm_ks = sorted({a.k for a in arms if a.k})
    log.info(f"load: step and pass times before the blocks (k = {arm_ks})")
    before = engine.step_times(ctx, arm_ks, "step times before")
    first = ctx.prompts[0]
    log.info(f"load: passes over {list(st.pass_lengths)} new tokens after prompt {first.id} (the costs of a load's steps)")
    rows: list[dict] = [pass_row(ctx, t) for t in engine.time_passes(ctx, first.id, ctx.inputs[first.id])]
    refused: dict[tuple[Arm, int], str] = {}
    for c in loads:
        for arm in arms:
            try:
                engine.prepare_load(ctx, arm, c)
            except LoadRefused as err:
                refused[(arm, c)] = str(err)
                log.warning(f"load: {engine.name} cannot serve load {c} with "
                            f"{arm_name(arm)}: {err}")
    block, stopped = 0, ""
    for r in range(int(st.rounds)):
        for c in rotated(loads, cfg, r):
            running = [a for a in arms if (a, c) not in refused]
            if PLAIN not in running or len(running) < 2:
                continue
            prompts = block_prompts(ctx, c, r)
            inputs = [ctx.inputs[p.id] for p in prompts]
            ctx.load.sample()  # between blocks: the machine's load while the runs are timed
            order = rotated(running, cfg, block)
            runs: dict[Arm, LoadRun] = {}
            for arm in order:
                try:
                    runs[arm] = engine.serve_load(ctx, arm, inputs, c)
                except LoadRefused as err:
                    refused[(arm, c)] = str(err)
                    log.warning(f"load: {engine.name} cannot serve load {c} with {arm.label}: {err}")
                    continue
                if runs[arm].stopped:
                    stopped = f"load {c}, {arm_name(arm)}: {runs[arm].stopped}"
                    break
            plain = {s.index: s.measured.tokens for s in runs[PLAIN].sent} if PLAIN in runs else None
            mem = engine.memory(ctx)
            for arm, lr in runs.items():
                head = {**identity(ctx), "measure": "request", "round": int(cfg.round) + r,
                        "rotation": int(cfg.rotation), "block": block, "load": c, "arm": arm.method,
                        "label": arm_name(arm), **arm.columns(),
                        "position": order.index(arm), **mem}
                rows += [{**head, **row} for row in block_rows(lr, prompts, plain if arm != PLAIN else None)]
            if c == 1 and bool(st.speed_check) and not stopped:
                rows += speed_runs(ctx, engine, prompts, inputs, block, r, mem)
            block += 1
            log.info(block_line(c, runs))
            if stopped:
                break
        if stopped:
            log.warning(f"load: stopped ({stopped}); every answered request is kept")
            break
    log.info("load: step and pass times after the blocks (drift check)")
    after = before if stopped else engine.step_times(ctx, arm_ks, "step times after")
    df = pd.DataFrame(rows, columns=[n for n in SCHEMA.names if n not in STEP_FIELDS + ["trust", "trust_detail"]])
    for when, (t_step, d_step, verify) in (("before", before), ("after", after)):
        df[f"target_step_{when}_s"] = t_step
        df[f"draft_step_{when}_s"] = d_step
        df[f"verify_{when}_s"] = df.k.map(verify).astype(float)
    if stopped:
        keep_answered(cfg, df, stopped)
    out = summarize(df, cfg)
    out.summary += [f"cannot serve: {line}" for line in dict.fromkeys(
        f"load {c}, {arm_name(a)}: {why}" for (a, c), why in refused.items())]
    return out


def keep_answered(cfg: DictConfig, df: pd.DataFrame, stopped: str) -> None:
    """A load that stopped (Ctrl-C, a dead server) is no finished job: its answered requests are written beside the
    stage's files, under interrupted/ (read by no analysis), and the job ends in one line naming them."""
    from pipeline.jobs.identity import output_path
    from store.files import atomic_write
    path = output_path(cfg, "load")
    kept = path.parent / "interrupted" / path.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(kept, lambda tmp: df.to_parquet(tmp, index=False))
    said = f"{stopped}; the {int((df.measure == 'request').sum())} requests answered are kept in {kept}"
    if "interrupted" in stopped:
        raise KeyboardInterrupt(said)
    raise LoadStopped(f"the load stopped at {said}")


def pass_row(ctx: StageContext, t) -> dict:
    p = t.timing
    return {**identity(ctx), "measure": "pass", "round": int(ctx.cfg.round), "rotation": int(ctx.cfg.rotation),
            "block": -1, "load": 1, "model": t.model, "pass_len": p.pass_len, "context_len": t.context_len,
            "median_s": p.median_s, "q25_s": p.q25_s, "q75_s": p.q75_s, "samples": p.samples, **t.memory}


def speed_runs(ctx: StageContext, engine, prompts: list, inputs: list, block: int, r: int, mem: dict) -> list[dict]:
    """The load-1 block's plain requests run again one at a time through the speed stage's ``run``."""
    gen, out = generator(ctx), []
    for i, (p, ids) in enumerate(zip(prompts, inputs)):
        toks, wall, prompt_s, _ = engine.run(ctx, PLAIN, ids, gen)
        out.append({**identity(ctx), "measure": "speed_run", "round": int(ctx.cfg.round) + r,
                    "rotation": int(ctx.cfg.rotation), "block": block, "load": 1, "arm": "plain", "label": "plain",
                    **PLAIN.columns(), "position": -1, "request": i, "prompt_id": p.id, "kind": p.kind, "client": 0,
                    "latency_s": wall, "prompt_s": prompt_s, "new_tokens": len(toks), "block_wall_s": np.nan,
                    "block_tokens_per_s": np.nan, "stopped": "", **mem})
    return out


def block_line(load: int, runs: dict[Arm, LoadRun]) -> str:
    parts = [f"{arm_name(a)} {sum(len(s.measured.tokens) for s in lr.sent) / lr.wall_s:.1f} "
             f"tok/s" for a, lr in runs.items() if lr.wall_s > 0]
    return f"load {load}: " + ", ".join(parts)


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "load")


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Per configuration and load: the latency and throughput gains over the adjacent plain block (child runs), and
    the load generator's tokens/s at load 1 over the speed stage's (``speed_check_ratio``)."""
    req = df[df.measure == "request"]
    level = float(OmegaConf.select(cfg, "stage.interval_level", default=0.95))
    gains = block_gains(req)
    arms, summary = [], []
    for (label, load), g in gains.groupby(["label", "load"], sort=False):
        m = {"load": float(load), "blocks": float(len(g))}
        for what in ("latency", "throughput"):
            point, lo, hi = gain_interval(g[f"{what}_gain"].to_numpy(), level)
            m.update({f"{what}_gain": point, f"{what}_gain_lo": lo, f"{what}_gain_hi": hi})
        sub = req[(req.label == label) & (req.load == load)]
        m["alpha"] = sub.accepted.sum() / sub.drafted.sum() if sub.drafted.sum() else np.nan
        m["identical_share"] = float(sub.identical_to_plain.mean())
        first = sub.iloc[0]
        arms.append(ArmResult(f"{label} load {int(load)}", {"arm": str(first.arm), "k": int(first.k),
                                                           "drafter": str(first.drafter),
                                                           "k_policy": str(first.k_policy), "load": int(load),
                                                           "kind": "all", "engine": str(first.engine)}, m, str(label)))
        summary.append(f"{label} at load {int(load)}: latency gain {interval_text(m, 'latency')}, throughput gain "
                       f"{interval_text(m, 'throughput')}, alpha {m['alpha']:.2f}, {int(m['blocks'])} blocks")
    metrics: dict[str, float] = {"blocks": float(req.block.nunique()) if len(req) else 0.0,
                                 "loads": float(req.load.nunique()) if len(req) else 0.0}
    check = speed_check(df)
    if check is not None:
        metrics.update(check)
        summary.append(f"load 1, plain: the load generator {check['load_tokens_per_s']:.2f} tok/s, the speed stage's "
                       f"runs of the same requests {check['speed_tokens_per_s']:.2f} tok/s (x{check['speed_check_ratio']:.3f}, "
                       f"{int(check['speed_check_blocks'])} blocks)")
    first = df.iloc[0] if len(df) else None
    if first is not None:
        drift = max(max(a / b, b / a) for a, b in ((first.target_step_after_s, first.target_step_before_s),
                                                   (first.draft_step_after_s, first.draft_step_before_s)) if a == a and b == b)
        metrics["drift_ratio"] = drift
    return StageOutput(df, metrics, summary, arms)


def interval_text(m: dict, what: str) -> str:
    lo, hi = m[f"{what}_gain_lo"], m[f"{what}_gain_hi"]
    return f"x{m[f'{what}_gain']:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if lo == lo else " (no interval)")
