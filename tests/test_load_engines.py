"""The load stage's closed loop on real servers (SmolLM2): llama.cpp's slots and vLLM's batch at 2 loads, the load
generator's clock against the server's own timings, and a dead server or Ctrl-C ending a load with every answered
request kept. Needs ``make llama-cpp`` / ``make vllm`` (markers llama_cpp / vllm: skipped without them unless
SPECLAB_REQUIRE_LLAMA=1 / SPECLAB_REQUIRE_VLLM=1)."""
from __future__ import annotations

import _thread
import threading

import pytest
from hydra import compose, initialize_config_dir

from pipeline.jobs.context import build_context
from speclab.specs.arms import PLAIN
from pipeline_helpers import CONF

pytestmark = pytest.mark.slow


def _ctx(tmp_path, engine: str, pair: str, new_tokens: int = 16):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"engine={engine}", f"pair={pair}", "stage=load", "prompts=smoke", f"max_new_tokens={new_tokens}",
            "stage.arms=[{drafter:model,ks:[2]}]", f"outputs_dir={tmp_path / 'outputs'}", "mlflow.enabled=false"])
    return build_context(cfg)


def _check_clock(ctx, loads=(1, 2)):
    """At each load: every request answered, at most ``load`` in flight and exactly that many at some time; the
    client's latency holds the server's own prompt and decode times, and at load 1 adds little to them."""
    engine = ctx.runner
    inputs = [ctx.inputs[p.id] for p in ctx.prompts] * 2
    spec = engine.arms(ctx, [2])[1]
    for c in loads:
        for arm in (PLAIN, spec):
            run = engine.serve_load(ctx, arm, inputs, c)
            assert not run.stopped and len(run.sent) == len(inputs) and run.most_in_flight == c
            for s in run.sent:
                r = s.measured
                latency = s.ended_s - s.started_s
                server = r.prompt_s + r.decode_s
                assert server <= latency + 0.005, (c, arm, latency, server)
                if c == 1:
                    assert latency - server < 0.05 + 0.1 * latency, (arm, latency, server)
            if arm != PLAIN:
                assert sum(s.measured.drafted for s in run.sent) > 0


def _dead_and_interrupted(ctx, kill):
    """A server killed mid-load ends it with the answered requests kept; so does Ctrl-C, after the requests in
    flight are answered."""
    engine = ctx.runner
    inputs = [ctx.inputs[p.id] for p in ctx.prompts] * 6
    engine.prepare_load(ctx, PLAIN, 2)
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    run = engine.serve_load(ctx, PLAIN, inputs, 2)
    timer.cancel()
    assert run.stopped.startswith("interrupted") and 0 < len(run.sent) < len(inputs)
    assert [s.index for s in run.sent] == list(range(len(run.sent)))  # every request sent was answered
    assert all(len(s.measured.tokens) > 0 for s in run.sent)
    timer = threading.Timer(4.0, kill)  # a few requests answered first (about 2 s each at 48 tokens here)
    timer.start()
    run = engine.serve_load(ctx, PLAIN, inputs, 2)
    timer.cancel()
    assert run.stopped.startswith("request") and 0 < len(run.sent) < len(inputs), run.stopped
    assert all(len(s.measured.tokens) > 0 for s in run.sent)


@pytest.mark.llama_cpp
def test_llama_server_slots_serve_two_loads_on_the_servers_clock(tmp_path):
    ctx = _ctx(tmp_path, "llama_cpp", "smollm2_int8")
    try:
        _check_clock(ctx)
    finally:
        ctx.close()


@pytest.mark.llama_cpp
def test_llama_server_dead_or_interrupted_mid_load_keeps_what_was_answered(tmp_path):
    ctx = _ctx(tmp_path, "llama_cpp", "smollm2_int8", new_tokens=48)
    try:
        _dead_and_interrupted(ctx, lambda: ctx.runner.engine.server(PLAIN, slots=2).proc.kill())
    finally:
        ctx.close()


@pytest.mark.vllm
def test_vllm_batch_serves_two_loads_on_the_servers_clock_and_a_dead_server_ends_a_load(tmp_path):
    ctx = _ctx(tmp_path, "vllm", "smollm2_bf16")
    try:
        _check_clock(ctx)
        server = ctx.runner.engine.server(PLAIN)
        _dead_and_interrupted(ctx, lambda: server.close())
    finally:
        ctx.close()
