"""The plan's predictions, and the sample of prompts they need: a plan job's acceptance part adds prompts of a kind
(the next ones of the kind in the file, after the sample prompts.per_kind chose) until the kind's recommendation is
told apart from every other configuration, or within ``stage.sample_precision`` of it, at the plan's level corrected
for the rivals and the sample sizes looked at (``speclab.costs.sample_rule``), or a budget is spent (``stage.sample_max_prompts`` a kind,
``stage.sample_budget_minutes`` for the job). Only the cheap part grows: the greedy reference and the replays of each
added prompt; the timing part ran once, before. The plan stage says per kind why its sample stopped (``stop_reason``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pandas as pd
from omegaconf import DictConfig

from pipeline.engines.base import engine_class, engine_of
from pipeline.jobs.identity import output_path
from pipeline.prompts.sets import Prompt, load_prompts
from speclab.costs.sample_rule import looks
from speclab.costs.planning import CONFIG_KEYS, Settled, price_runs, recommend, settled

log = logging.getLogger("speclab")


def this_job(cfg: DictConfig, stage: str) -> pd.DataFrame:
    """This job's own results of an earlier part (``stage``)."""
    path = output_path(cfg, stage)
    if not path.exists():
        raise ValueError(f"stage plan needs this job's {stage} results ({path} is missing): "
                         "run it as part of stage=plan, whose parts are [timing, acceptance, plan]")
    return pd.read_parquet(path)


def predictions(engine: str, timing: pd.DataFrame, acc: pd.DataFrame) -> pd.DataFrame:
    """Every acceptance run's predicted speed-up: an engine whose rows are its loop's iterations (speclab's) by its
    time model, an engine of requests by its own costs and counters (calibrated on the plan's own requests)."""
    return price_runs(timing, acc, acc, engine_class(engine).counts_iterations)


def grows(cfg: DictConfig) -> bool:
    """Whether this job grows its sample: a plan job with ``stage.sample_precision`` set, on a sample (per_kind > 0)."""
    return (str(cfg.stage.name) == "plan" and cfg.stage.get("sample_precision") is not None
            and int(cfg.prompts.per_kind) > 0)


def sample_looks(cfg: DictConfig) -> int:
    """The sample sizes a plan job may look at (from prompts.per_kind to stage.sample_max_prompts): the sample rule's
    correction (``speclab.costs.sample_rule``); one where the sample does not grow."""
    if not grows(cfg):
        return 1
    return looks(int(cfg.prompts.per_kind), int(cfg.stage.sample_max_prompts))


def kinds_settled(pred: pd.DataFrame, rec: pd.DataFrame, precision: float, level: float,
                  n_looks: int = 1) -> dict[str, Settled]:
    """Per kind: whether its sample tells its recommendation apart from every rival (``speclab.costs.planning.settled``)."""
    out = {}
    for kind, g in rec[rec.recommended & (rec.kind != "all")].groupby("kind"):
        chosen = tuple(g.iloc[0][c] for c in CONFIG_KEYS)
        out[kind] = settled(pred[pred.kind == kind], (chosen[0], chosen[1], int(chosen[2])), precision, level, n_looks)
    return out


def more_prompts(cfg: DictConfig, kind: str, seen: set[str]) -> list[Prompt]:
    """The kind's prompts after the job's skipped ones that the sample does not hold yet, in file order."""
    p = cfg.prompts
    return [q for q in load_prompts(p.file, [kind], 0, int(p.skip_per_kind)) if q.id not in seen]


def engine_name(ctx) -> str:
    return str(engine_of(ctx).name)


def grow_sample(ctx, acc: pd.DataFrame, run_more: Callable[[list[Prompt]], pd.DataFrame],
                per_prompt_s: float) -> pd.DataFrame:
    """Add one prompt to each kind not settled yet (least settled first), round after round, while a kind is open and
    its prompt fits the time left from the acceptance part's start (``ctx.part_started``: the sample's own time, not the
    timing part's before it): each priced at ``per_prompt_s``, the mean cost of the first sample's prompts, or a later
    round's if dearer."""
    cfg = ctx.cfg
    st = cfg.stage
    precision, cap, level = float(st.sample_precision), int(st.sample_max_prompts), float(st.level)
    budget_s = 60 * float(st.sample_budget_minutes)
    timing = this_job(cfg, "timing")
    engine = engine_name(ctx)
    while True:
        pred = predictions(engine, timing, acc)
        state = kinds_settled(pred, recommend(pred, level), precision, level, sample_looks(cfg))
        counts = acc.groupby("kind").prompt_id.nunique()
        seen = set(acc.prompt_id)
        open_kinds = {k: more_prompts(cfg, k, seen) for k, s in state.items() if not s.settled and counts[k] < cap}
        open_kinds = {k: q for k, q in open_kinds.items() if q}
        if not open_kinds:
            return acc
        began_sample = ctx.part_started or ctx.started
        fit = int((budget_s - (time.monotonic() - began_sample)) // per_prompt_s)
        if fit < 1:
            log.info(f"[acceptance] the plan's sample stops: the next prompt would end its sample after "
                     f"{st.sample_budget_minutes} minutes (stage.sample_budget_minutes); open kinds: {sorted(open_kinds)}")
            return acc
        kinds = sorted(open_kinds, key=lambda k: (state[k].margin if state[k].margin == state[k].margin else 0.0))[:fit]
        added = [open_kinds[k][0] for k in kinds]
        log.info("[acceptance] the plan's sample grows: " + "; ".join(
            f"{k} to {counts[k] + 1} prompts ({margin_text(state[k])})" for k in kinds))
        began = time.monotonic()
        ctx.add_prompts(added)
        acc = pd.concat([acc, run_more(added)], ignore_index=True)
        # Priced at the dearest round so far: kinds differ in cost (a long prompt's reference and runs), and the
        # budget is one the job should keep, not one it should overrun by a round.
        per_prompt_s = max(per_prompt_s, (time.monotonic() - began) / len(added))


def margin_text(s: Settled) -> str:
    if s.margin != s.margin or s.margin <= 0:  # 0: the corrected bound is unbounded below at this sample size
        return f"no bound yet from {s.prompts} prompt(s)"
    return f"at least {s.margin:.3f} of its closest rival's speed-up, of {s.rivals}"


def stop_reason(cfg: DictConfig, kind: str, s: Settled | None, n: int, seen: set[str]) -> str:
    """Why a kind's sample is the size it is, for the plan's rows and console."""
    st = cfg.stage
    if st.get("sample_precision") is None:
        return "sample as chosen (stage.sample_precision=null)"
    if int(cfg.prompts.per_kind) == 0:
        return "every prompt of the kind (prompts.per_kind=0)"
    level = f"{100 * float(st.level):.0f}%"
    if s is not None and s.settled:
        return (f"settled at {n} prompts: at {level} at least {s.margin:.3f} of every one of {s.rivals} rivals "
                f"(within stage.sample_precision={float(st.sample_precision):g})")
    bound = margin_text(s) if s is not None else "no rival"
    if n >= int(st.sample_max_prompts):
        return f"not settled ({bound}): stopped at stage.sample_max_prompts={int(st.sample_max_prompts)}"
    if not more_prompts(cfg, kind, seen):
        return f"not settled ({bound}): the file has no more prompts of the kind"
    return f"not settled ({bound}): stopped by stage.sample_budget_minutes={float(st.sample_budget_minutes):g}"
