"""Stage timing: target and draft pass times over 1..9 new tokens after the prompt (and after longer
contexts: ``context_extra``), and optionally both models' prefill times (rows with context_len 0).
Every row also carries both models' sizes (parameters, weight bytes as held in memory, decoder layers), so
a cost ratio can be set beside the size ratios.
Same concept, other floor: ``speclab/decoding/timing.py``."""
from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.jobs.context import StageContext
from pipeline.engines.base import engine_of
from store.records import make_schema
from pipeline.jobs.stage_output import StageOutput
from pipeline.stages.shared import IDENTITY_FIELDS, MEMORY_FIELDS, TRUST_FIELDS, identity
from pipeline.jobs.run_names import run_name
from pipeline.config.stage_options import unused_note

# Added after results were stored: older files read them as not measured (store.compat.LATER_COLUMNS).
SIZE_FIELDS = [(f"{role}_{what}", kind) for role in ("target", "draft")
               for what, kind in (("params", "int64"), ("bytes", "int64"), ("layers", "int32"))]

SCHEMA = make_schema(IDENTITY_FIELDS + [
    ("prompt_id", "string"), ("kind", "string"), ("context_len", "int32"), ("model", "string"),
    ("pass_len", "int32"), ("median_s", "float64"), ("q25_s", "float64"), ("q75_s", "float64"),
    ("samples", "int32"),
] + MEMORY_FIELDS + SIZE_FIELDS + TRUST_FIELDS)


def timed_prompts(ctx: StageContext) -> list:
    """The prompts whose passes are timed: the first ``stage.time_per_kind`` of each kind, or (0) the first
    ``stage.prompts_to_time`` of the selection."""
    st = ctx.cfg.stage
    per_kind = int(st.time_per_kind)
    if per_kind:
        kinds = dict.fromkeys(p.kind for p in ctx.prompts)
        return [p for kind in kinds for p in [q for q in ctx.prompts if q.kind == kind][:per_kind]]
    return ctx.prompts[: int(st.prompts_to_time)]


def run(ctx: StageContext) -> StageOutput:
    """Each timed prompt's passes as the job's engine times them (``Engine.time_passes``), with its models' sizes."""
    engine = engine_of(ctx)
    sizes = engine.model_sizes(ctx)
    rows = []
    # a prompt's passes take minutes in a server engine (a plan's timing part ran 17 minutes here): its progress and
    # the time left, as the other stages show theirs
    for prompt in tqdm(timed_prompts(ctx), desc="timing passes", unit="prompt", leave=False):
        ctx.load.sample()  # between prompts: the machine's load while the passes are timed
        for p in engine.time_passes(ctx, prompt.id, ctx.inputs[prompt.id]):
            t = p.timing
            rows.append({**identity(ctx), "prompt_id": prompt.id, "kind": prompt.kind, "context_len": p.context_len,
                         "model": p.model, "pass_len": t.pass_len, "median_s": t.median_s, "q25_s": t.q25_s,
                         "q75_s": t.q75_s, "samples": t.samples, **p.memory, **sizes})
    return summarize(pd.DataFrame(rows), ctx.cfg)


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
