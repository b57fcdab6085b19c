"""The load stage through the engine seam: speclab's batched loop serves waves, plain beside each configuration at
every load with the same requests, per-request timings that add up, and an engine that cannot serve a load is one
line."""
import time

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.engines.base import Engine, LoadRefused, RequestResult
from pipeline.run import run_parts
from pipeline.stages import load
from pipeline.jobs.identity import output_path
from speclab.specs.arms import PLAIN
from pipeline_helpers import make_cfg


def test_the_stage_runs_every_load_with_plain_beside_and_the_same_requests(tmp_path):
    cfg = make_cfg(tmp_path, "stage=load", "stage.concurrency=[1,3]", "stage.rounds=2", "stage.requests=2",
                   "stage.pass_lengths=[1,3]", "stage.repeats=1", "stage.warmup=0", "stage.timing_repeats=1",
                   "stage.timing_warmup=0", "stage.arms=[{drafter:model,ks:[2]}]", "pair.draft=copy")
    run_parts(cfg)
    path = output_path(cfg, "load")
    assert pq.read_schema(path).remove_metadata() == load.SCHEMA
    df = pd.read_parquet(path)
    req = df[df.measure == "request"]
    assert sorted(req.load.unique()) == [1, 3]
    for (c, block), g in req.groupby(["load", "block"]):
        plain, spec = g[g.arm == "plain"], g[g.arm == "speculative"]
        assert len(plain) == len(spec) == max(2, 2 * c)
        assert list(plain.prompt_id) == list(spec.prompt_id)  # the same requests, in order
        assert spec.identical_to_plain.all()  # greedy, a perfect draft: the batched loop's rows equal plain's
        assert (spec.accepted == spec.drafted).all() and (spec.drafted > 0).all()
        # a wave: its requests start and end together, at most ``load`` at once
        assert (g.most_in_flight <= c).all()
    # each request's latency = its time to first token + its time after it
    assert ((req.ttft_s + req.decode_s - req.latency_s).abs() < 1e-9).all()
    assert (req.tpot_s * (req.new_tokens - 1) - req.decode_s).abs().max() < 1e-9
    passes = df[df.measure == "pass"]
    assert set(zip(passes.model, passes.pass_len)) == {(m, n) for m in ("target", "draft") for n in (1, 3)}
    speed = df[df.measure == "speed_run"]
    assert len(speed) == 2 * 2 and set(speed.load) == {1}  # load 1's plain requests, run again by the speed stage


class _Refusing(Engine):
    name = "fake"


class _Server(Engine):
    name = "fake-server"

    def prepare_load(self, ctx, arm, concurrency):
        if concurrency > 2:
            raise LoadRefused(f"fake-server has 2 slots: a load of {concurrency} would queue")

    def load_request(self, ctx, arm, ids, concurrency):
        time.sleep(0.05)
        return RequestResult([1, 2, 3], 0.05, 0.01, 0.04)


def test_an_engine_serves_a_load_through_the_closed_loop_or_refuses_it_in_one_line():
    run = _Server().serve_load(None, PLAIN, [None] * 4, 2)
    assert len(run.sent) == 4 and run.most_in_flight == 2 and not run.stopped
    assert 0.09 < run.wall_s < 0.3  # two clients, two requests each
    with pytest.raises(LoadRefused, match="a load of 3 would queue"):
        _Server().serve_load(None, PLAIN, [None] * 4, 3)
    with pytest.raises(LoadRefused, match="engine fake cannot serve concurrent requests"):
        _Refusing().serve_load(None, PLAIN, [None] * 4, 2)


def test_every_block_holds_every_kind_and_rounds_move_on_through_the_prompts():
    from types import SimpleNamespace
    prompts = [SimpleNamespace(id=f"{k}{i}", kind=k) for k in ("prose", "code", "structured") for i in range(4)]
    ctx = SimpleNamespace(prompts=prompts, cfg=SimpleNamespace(stage=SimpleNamespace(requests=4)))
    first = load.block_prompts(ctx, 1, 0)
    assert [p.id for p in first] == ["prose0", "code0", "structured0", "prose1"]
    assert [p.id for p in load.block_prompts(ctx, 1, 1)] == ["code1", "structured1", "prose2", "code2"]
    for c in (1, 2, 4, 8):
        for r in range(6):
            block = load.block_prompts(ctx, c, r)
            assert len(block) == max(4, 2 * c) and {p.kind for p in block} == {"prose", "code", "structured"}


@pytest.mark.parametrize("why, error", [("request 2 failed: ServerError: the server died", "LoadStopped"),
                                        ("interrupted (Ctrl-C): no request sent after it", "KeyboardInterrupt")])
def test_a_load_that_stops_is_no_finished_job_and_keeps_what_was_answered(tmp_path, monkeypatch, why, error):
    from engines.speclab.runner import SpeclabRunner
    from pipeline.engines.closed_loop import LoadStopped
    served = SpeclabRunner.serve_load

    def stops_at_load_3(self, ctx, arm, inputs, concurrency):
        run = served(self, ctx, arm, inputs[:1] if concurrency == 3 else inputs, concurrency)
        if concurrency == 3:
            run.stopped = why
        return run

    monkeypatch.setattr(SpeclabRunner, "serve_load", stops_at_load_3)
    cfg = make_cfg(tmp_path, "stage=load", "stage.concurrency=[1,3]", "stage.rounds=1", "stage.requests=2",
                   "stage.pass_lengths=[1,3]", "stage.repeats=1", "stage.warmup=0", "stage.timing_repeats=1",
                   "stage.timing_warmup=0", "stage.arms=[{drafter:model,ks:[2]}]", "pair.draft=copy")
    with pytest.raises(LoadStopped if error == "LoadStopped" else KeyboardInterrupt, match="requests answered are kept"):
        run_parts(cfg)
    path = output_path(cfg, "load")
    assert not path.exists()  # not filed as a finished job: a rerun measures it again
    kept = pd.read_parquet(path.parent / "interrupted" / path.name)
    req = kept[kept.measure == "request"]
    assert set(req.load) == {1, 3} and (req[req.load == 3].stopped == why).all()
