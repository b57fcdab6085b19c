"""The distribution stage's test of an engine's own speculative sampler (``Engine.sampler_draws``), on the tiny pair:
a fake engine that drafts greedily as vLLM does (its proposal the draft's arg-max) and samples through the exact rule
passes; one that keeps its proposal when the target would have rejected it is rejected; and each engine's rows come
with the wrong rules' draws at its own proposals, which the test rejects."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from pipeline_helpers import make_cfg

from engines.speclab.runner import SpeclabRunner
from pipeline.engines.base import SamplerDraws
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts


def greedy_proposal_draws(p: torch.Tensor, q: torch.Tensor, runs: int, seed: int, keep: bool) -> tuple:
    """``runs`` tokens from the exact rule with the draft's arg-max as a point-mass proposal (``keep``: the proposal
    kept whatever the coin says, a sampler that skips its check)."""
    g = torch.Generator().manual_seed(seed)
    x = int(q.argmax())
    point = torch.zeros_like(p)
    point[x] = 1.0
    residual = torch.clamp(p - point, min=0)
    accept = torch.rand(runs, generator=g) < p[x]
    others = torch.multinomial(residual / residual.sum(), runs, replacement=True, generator=g)
    drawn = torch.where(accept | keep, torch.full_like(others, x), others)
    return np.bincount(drawn.numpy(), minlength=p.shape[0]), point


class GreedyDraftEngine(SpeclabRunner):
    """speclab's loop, plus a sampler of its own: the exact rule over greedy proposals."""

    keep = False

    def sampler_draws(self, ctx, context, runs, sampling, seed):
        counts, q = greedy_proposal_draws(context.p.cpu(), context.q.cpu(), runs, seed, self.keep)
        return [SamplerDraws("fake greedy k=1", counts, q, runs)]


class SkipsCheckEngine(GreedyDraftEngine):
    keep = True


def run_with(tmp_path, engine: str) -> pd.DataFrame:
    cfg = make_cfg(tmp_path, f"engine._target_={__name__}.{engine}", "stage=distribution", "stage.draws=2000",
                   "stage.seeds=[0]", "stage.engine_runs=3000", "prompts.per_kind=1", "sampling.temperature=2.0")
    run_parts(cfg)
    return pd.read_parquet(output_path(cfg, "distribution"))


def test_an_engines_exact_sampler_passes_and_its_wrong_rules_fail(tmp_path):
    df = run_with(tmp_path, "GreedyDraftEngine")
    engine = df[df.rule == "fake greedy k=1"]
    assert len(engine) == 3 and (~engine.no_power).all() and (engine.draws == 3000).all()
    assert engine.pvalue.min() > 1e-4
    keep = df[df.rule == "fake greedy k=1 as keep_draft"]
    assert len(keep) == 3 and keep.rejected.all()
    resample = df[df.rule == "fake greedy k=1 as resample_target"]  # weak where p(proposal) is near 0 or 1
    assert len(resample) == 3 and (resample.power > 0.9).any() and resample[resample.power > 0.9].rejected.all()


def test_an_engine_that_skips_its_check_is_rejected(tmp_path):
    engine = run_with(tmp_path, "SkipsCheckEngine").query("rule == 'fake greedy k=1'")
    assert len(engine) == 3 and engine.rejected.all()
