"""The speed stage's sequential design (stage.race, stage.precision, the budget): on the tiny pair with an engine
whose arms' speeds are set (the real loop runs; only its wall time is replaced), a clearly slower arm leaves the
race with its reason and keeps the blocks it ran, a decided or precise kind stops early, and the fixed design is
unchanged."""
from __future__ import annotations

import numpy as np

from speclab.stats.intervals import runs_needed

from pipeline.jobs.context import build_context
from engines.speclab.runner import SpeclabRunner
from pipeline.stages import speed
from pipeline.stages.speed_race import BUDGET_ROUNDS, FIXED, STOPS
from pipeline_helpers import make_cfg
from speclab.stats.racing import DECIDED, FIRST_LOOK, PRECISION

BASE = ["stage=speed", "stage.timing_repeats=1", "stage.timing_warmup=0"]
KINDS = "prompts.kinds=[code,prose]"


class SetSpeeds(SpeclabRunner):
    """speclab's loop, with each arm's wall time set by its k: ``speed[k]`` times plain's, 2% noise per run."""

    def __init__(self, speeds: dict[int, float], seed: int = 0) -> None:
        super().__init__()
        self.speeds, self.rng = speeds, np.random.default_rng(seed)

    def run(self, ctx, arm, ids, gen):
        toks, _, prefill, extra = super().run(ctx, arm, ids, gen)
        factor = self.speeds[arm.k] if arm.k else 1.0
        return toks, len(toks) / (100.0 * factor) * float(np.exp(self.rng.normal(0, 0.02))), prefill, extra


def run_stage(tmp_path, speeds, *overrides):
    kinds = [] if any(o.startswith("prompts.kinds") for o in overrides) else [KINDS]
    ctx = build_context(make_cfg(tmp_path, *BASE, *kinds, *overrides))
    ctx.runner = SetSpeeds(speeds)
    return speed.run(ctx)


def test_a_clearly_slower_arm_leaves_the_race_with_its_reason_and_keeps_the_blocks_it_ran(tmp_path):
    out = run_stage(tmp_path, {1: 2.0, 2: 2.0, 3: 0.5}, "stage.ks=[1,2,3]", "stage.rounds=8", "stage.race=true")
    df = out.rows
    for kind, g in df.groupby("kind"):
        slow = g[g.k == 3]
        assert slow.block.nunique() == FIRST_LOOK, kind  # dropped at the first look
        assert slow.stopped_by.str.match(r"dropped: slower than draft model k=[12] after 4 blocks").all()
        assert g[g.k == 1].block.nunique() == 8 and (g[g.k == 1].stopped_by == BUDGET_ROUNDS).all()
        assert (g[g.arm == "plain"].stopped_by == BUDGET_ROUNDS).all()
    assert any(line.startswith("code: 8 blocks") and "dropped draft model k=3" in line for line in out.summary)
    arm = next(a for a in out.arms if a.params["k"] == 3 and a.params["kind"] == "code")
    assert arm.params["stopped_by"].startswith("dropped: ") and arm.metrics["runs"] == FIRST_LOOK
    assert {"precision", "minutes", "level"} <= set(arm.metrics) and arm.metrics["level"] == 0.95
    assert {"blocks", "minutes", "level"} <= set(out.metrics)


def test_a_kind_stops_when_every_rival_of_the_leader_is_clearly_slower(tmp_path):
    out = run_stage(tmp_path, {1: 2.0, 2: 1.0}, "stage.ks=[1,2]", "stage.rounds=12", "stage.race=true")
    df = out.rows
    # k=2 and plain leave at the first look (4 blocks); the kind stops once its leader has an interval (6 blocks)
    assert df.groupby("kind").block.nunique().tolist() == [runs_needed(0.95)] * 2
    assert (df[df.k == 2].groupby("kind").block.nunique() == FIRST_LOOK).all()
    # plain left the race too, but its runs are every block's baseline: they stop with the kind
    assert (df[df.arm == "plain"].stopped_by == STOPS[DECIDED]).all()
    assert df[df.k == 2].stopped_by.str.startswith("dropped: slower than draft model k=1 after 4 blocks").all()
    assert (df[df.k == 1].stopped_by == STOPS[DECIDED]).all()
    assert any("stopped by decided" in line for line in out.summary)


def test_a_kind_stops_once_every_running_arm_is_precise_enough(tmp_path):
    out = run_stage(tmp_path, {1: 1.5, 2: 1.52}, "stage.ks=[1,2]", "stage.rounds=20", "stage.precision=0.2")
    df = out.rows
    for _, g in df.groupby("kind"):
        blocks = g.block.nunique()
        assert 6 <= blocks < 20  # an interval needs 6 blocks at 95%; 2% noise makes it narrow at once
        assert (g.stopped_by == STOPS[PRECISION]).all()
    arm = next(a for a in out.arms if a.params["k"] == 1)
    assert arm.metrics["precision"] <= 0.2


def test_a_race_that_cannot_decide_spends_its_budget_and_says_so(tmp_path):
    out = run_stage(tmp_path, {1: 1.5, 2: 1.5}, "stage.ks=[1,2]", "stage.rounds=5", "stage.race=true")
    df = out.rows
    assert df.groupby("kind").block.nunique().tolist() == [5, 5]
    assert (df.stopped_by == BUDGET_ROUNDS).all()


def test_the_fixed_design_runs_every_round_and_says_rounds(tmp_path):
    out = run_stage(tmp_path, {1: 2.0, 2: 0.5}, "stage.ks=[1,2]", "stage.rounds=3", "stage.race=false",
                    "stage.precision=null")
    df = out.rows
    assert df.block.nunique() == 6 and len(df) == 18
    assert (df.stopped_by == FIXED).all()
    assert not any("stopped by" in line for line in out.summary)


def test_a_minutes_budget_starts_no_block_after_it_is_spent(tmp_path):
    out = run_stage(tmp_path, {1: 1.5, 2: 1.5}, "stage.ks=[1,2]", "stage.rounds=50", "stage.race=true",
                    "stage.budget_minutes=0.0001")
    df = out.rows
    assert df.block.nunique() == 1  # the first block runs, then the budget is spent
    assert (df.stopped_by == "budget: minutes").all()


def test_a_kind_of_several_prompts_is_looked_at_after_whole_rounds_only(tmp_path):
    out = run_stage(tmp_path, {1: 2.0, 2: 2.0, 3: 0.5}, "stage.ks=[1,2,3]", "stage.rounds=4", "stage.race=true",
                    "prompts.per_kind=3", "prompts.kinds=[code]")
    slow = out.rows[out.rows.k == 3]
    assert slow.block.nunique() == 6  # the first look with >= 4 blocks that sees each of the 3 prompts equally: 6
    assert slow.stopped_by.str.contains("after 6 blocks").all()
