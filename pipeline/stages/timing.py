"""Stage timing: target and draft pass times over 1..9 new tokens after the prompt (and after longer
contexts: ``context_extra``), and optionally both models' prefill times (rows with context_len 0).
Every row also carries both models' sizes (parameters, weight bytes as held in memory, decoder layers), so
a cost ratio can be set beside the size ratios.
Same concept, other floor: ``speclab/decoding/timing.py``."""
from __future__ import annotations

import statistics

import pandas as pd
from omegaconf import DictConfig

from pipeline.jobs.context import StageContext
from pipeline.engines.option_checks import on_llama
from store.records import make_schema
from pipeline.jobs.stage_output import StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, identity
from pipeline.jobs.context import memory_columns
from pipeline.jobs.run_names import run_name
from pipeline.config.stage_options import unused_note
from speclab.models.size import model_size
from speclab.measures.step_costs import PassTiming, pass_times, prefill_times, tree_pass_times

# Added after results were stored: older files read them as not measured (store.compat.LATER_COLUMNS).
SIZE_FIELDS = [(f"{role}_{what}", kind) for role in ("target", "draft")
               for what, kind in (("params", "int64"), ("bytes", "int64"), ("layers", "int32"))]

SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("context_len", "int32"), ("model", "string"),
    ("pass_len", "int32"), ("median_s", "float64"), ("q25_s", "float64"), ("q75_s", "float64"),
    ("samples", "int32"),
] + MEMORY_FIELDS + SIZE_FIELDS + TRUST_FIELDS)


def size_columns(target, draft) -> dict:
    """Both models' parameter count, weight bytes and decoder layers, as the row columns of SIZE_FIELDS."""
    out = {}
    for role, model in (("target", target), ("draft", draft)):
        size = model_size(model)
        out.update({f"{role}_params": size.params, f"{role}_bytes": size.bytes, f"{role}_layers": size.layers})
    return out


def summary_of(pass_len: int, samples: list[float]) -> PassTiming:
    """Median and quartiles of one pass length's timed samples, as speclab's own pass timing reports them."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return PassTiming(pass_len, statistics.median(s), q[0], q[2], len(s))


def timed_prompts(ctx: StageContext) -> list:
    """The prompts whose passes are timed: the first ``stage.time_per_kind`` of each kind, or (0) the first
    ``stage.prompts_to_time`` of the selection."""
    st = ctx.cfg.stage
    per_kind = int(st.time_per_kind)
    if per_kind:
        kinds = dict.fromkeys(p.kind for p in ctx.prompts)
        return [p for kind in kinds for p in [q for q in ctx.prompts if q.kind == kind][:per_kind]]
    return ctx.prompts[: int(st.prompts_to_time)]


def engine_rows(ctx: StageContext) -> list[dict]:
    """llama.cpp's passes (engine=llama_cpp): the target's and the draft's pass over m new tokens after the prompt
    (plus ``context_extra`` more tokens), each the server's processing of a cached context extended by m tokens
    (the plain answer's tokens); sizes from the GGUF files."""
    st, runner = ctx.cfg.stage, ctx.runner
    lengths, extras = [int(n) for n in st.pass_lengths], [int(e) for e in st.context_extra]
    sizes = runner.model_sizes()
    limit = int(runner.settings["ctx_size"])
    rows = []
    for prompt in timed_prompts(ctx):
        ctx.load.sample()  # between prompts: the machine's load while the passes are timed
        ids = ctx.inputs[prompt.id]
        n = ids.shape[1]
        if n + max(extras) + max(lengths) > limit:
            raise ValueError(f"stage.context_extra={max(extras)} with pass_lengths up to {max(lengths)} after prompt "
                             f"{prompt.id} ({n} tokens) exceeds llama.cpp's context of {limit} tokens: raise "
                             "engine.ctx_size or lower stage.context_extra")
        ext = runner.extension(ctx, ids, prompt.id, max(extras) + max(lengths))
        for role in ("target", "draft"):
            mem = runner.memory(ctx)
            for e in extras:
                times = runner.engine.pass_times(ids[0].tolist() + ext[:e], ext[e:], lengths, int(st.repeats),
                                                 int(st.warmup), role)
                for m in lengths:
                    t = summary_of(m, times[m])
                    rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, "context_len": n + e,
                                 "model": role, "pass_len": m, "median_s": t.median_s, "q25_s": t.q25_s,
                                 "q75_s": t.q75_s, "samples": t.samples, **mem, **sizes})
    return rows


def run(ctx: StageContext) -> StageOutput:
    if on_llama(ctx):
        return summarize(pd.DataFrame(engine_rows(ctx), columns=SCHEMA.names), ctx.cfg)
    st = ctx.cfg.stage
    lengths = [int(n) for n in st.pass_lengths]
    rows = []
    extras = [int(e) for e in st.context_extra]
    sizes = size_columns(ctx.pair.target, ctx.pair.draft)
    for prompt in timed_prompts(ctx):
        ctx.load.sample()  # between prompts: the machine's load while the passes are timed
        ids = ctx.inputs[prompt.id]
        n = ids.shape[1]
        for role, model in (("target", ctx.pair.target), ("draft", ctx.pair.draft)):
            mem = memory_columns(ctx)  # where the weights are when this time is taken
            timed = [(n + e, t, role) for e in extras
                     for t in pass_times(model, ids, lengths, int(st.repeats), int(st.warmup), context_extra=e)]
            if role == "target" and st.tree_nodes:
                # model "target_tree": the verification of a tree of n nodes (pass_len n + 1), the 4D mask's path
                trees = tree_pass_times(model, ids, [int(x) for x in st.tree_nodes], int(st.repeats), int(st.warmup))
                timed += [(n, t, "target_tree") for t in trees]
            if st.prefill:
                # Context 0: a prefill of the first pass_len prompt tokens (n - 1 in a loop that prefills apart, n in
                # plain decoding; a merged prefill's prompt plus proposals is the fitted line a few tokens on).
                timed += [(0, t, role) for t in prefill_times(model, ids, sorted({max(n - 1, 1), n}), int(st.repeats),
                                                        int(st.warmup))]
            for context_len, t, label in timed:
                rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind,
                             "context_len": context_len, "model": label, "pass_len": t.pass_len,
                             "median_s": t.median_s, "q25_s": t.q25_s, "q75_s": t.q75_s,
                             "samples": t.samples, **mem, **sizes})
    df = pd.DataFrame(rows)
    return summarize(df, ctx.cfg)


def describe(cfg: DictConfig) -> str:
    return run_name(cfg, "timing")


def summarize(df: pd.DataFrame, cfg: DictConfig) -> StageOutput:
    """Headline metrics and summary lines of a timing result (also used to log a run from its file)."""
    passes = df[df.context_len > 0]  # context 0 rows are prefills
    lengths = sorted(int(n) for n in passes[passes.model == "target"].pass_len.unique())
    med = passes[passes.context_len == passes.groupby("prompt_id").context_len.transform("min")].groupby(
        ["model", "pass_len"]).median_s.median()
    target_step = med[("target", 1)]
    metrics = {"target_step_ms": 1e3 * target_step, "draft_step_ms": 1e3 * med[("draft", 1)],
               "c_draft": med[("draft", 1)] / target_step}
    metrics.update({f"c_verify_n{n}": med[("target", n)] / target_step for n in lengths})
    summary = [f"target step {metrics['target_step_ms']:.1f} ms, draft step {metrics['draft_step_ms']:.1f} ms "
               f"(c_draft = {metrics['c_draft']:.3f})",
               "target pass / target step by new tokens: "
               + ", ".join(f"{n}: {metrics[f'c_verify_n{n}']:.2f}" for n in lengths)]
    trees = sorted(int(n) for n in passes[passes.model == "target_tree"].pass_len.unique())
    if trees:
        metrics.update({f"c_tree_nodes{n - 1}": med[("target_tree", n)] / target_step for n in trees})
        summary.append("tree verification / target step by tree nodes: "
                       + ", ".join(f"{n - 1}: {metrics[f'c_tree_nodes{n - 1}']:.2f}" for n in trees))
    if not df.memory_trusted.all():
        summary.append(f"WARNING: memory placement not trusted: {df.memory_reason[~df.memory_trusted].iloc[0]}")
    return StageOutput(df, metrics, summary + unused_note(cfg, "timing"))
