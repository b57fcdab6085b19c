"""The engine seam (pipeline/engines/base.py): a stub engine defined here, chosen through the engine config group
(``engine._target_``), runs the timing, acceptance, speed and divergence stages in one job, and its rows carry
the stub's own counters and timings; no stage file names an engine.

The stub is a fake: deterministic tokens, counters and times, no model (its context drops the pair's models, so a
stage that reached for them would fail). It checks the seam, not a measurement.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from pipeline_helpers import make_cfg

from pipeline.config.schema import ConfigError
from pipeline.engines.base import ENGINES, Engine, RequestResult, StepTimes, TimedPass
from pipeline.engines.option_checks import check_engine
from pipeline.jobs.context import own_context
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from speclab.measures.step_costs import PassTiming
from speclab.models.loading import ModelPair
from speclab.specs.arms import PLAIN, Arm

ROOT = Path(__file__).resolve().parents[1]
DRAFTED, ACCEPTED, PER_POS = 6, 4, [3, 1]  # every speculative request's counters
DIVERGES_AT_K = 3  # the speculative request at this k differs from plain at token DIFF (a near-tie, see top_probs)
DIFF = 2
PLAIN_WALL, SPEC_WALL = 0.02, 0.01  # seconds per request: every speculative arm twice plain's speed


class StubEngine(Engine):
    """A fake engine of requests: tokens counted up from the prompt's last id, fixed counters and times."""

    stage_parts = ("timing", "acceptance", "speed", "divergence")

    def __init__(self, **_) -> None:
        self.name = "stub"  # the config's engine.name stays an option name; the rows say which engine ran them
        self.requests: list[tuple[str, int | None, bool, int]] = []
        self.closed = False

    def context(self, cfg, prompts):
        ctx = own_context(cfg, prompts)  # the prompts' token ids, made as speclab makes them
        p = ctx.pair
        ctx.pair = ModelPair(None, None, p.tokenizer, p.target_name, p.draft_name, p.device, p.eos_token_id)
        ctx.runner = self
        return ctx

    def close(self) -> None:
        self.closed = True

    def weights(self, cfg) -> str:
        return "stub-q4"

    def draft_name(self, cfg) -> str:
        return "stub-draft"

    def arms(self, ctx, ks):
        return [PLAIN, *(Arm("speculative", k, "fixed", "model", self.name) for k in ks)]

    def plain_tokens(self, ctx, ids) -> list[int]:
        first = int(ids[0, -1])
        return [(first + 1 + i) % 40 for i in range(int(ctx.cfg.max_new_tokens))]

    def request(self, ctx, arm, ids, gen=None, n_probs=0, greedy=False) -> RequestResult:
        self.requests.append((arm.method, arm.k, greedy, n_probs))
        tokens = self.plain_tokens(ctx, ids)
        spec = arm.method != "plain"
        if spec and arm.k == DIVERGES_AT_K:
            tokens[DIFF] = 45  # the plain run's runner-up there
        probs = [[(t, 0.9), (44, 0.1)] for t in tokens] if n_probs else None
        if probs:
            probs[DIFF] = [(tokens[DIFF], 0.52), (45, 0.48)]
        wall = SPEC_WALL if spec else PLAIN_WALL
        return RequestResult(tokens, wall, 0.002, wall - 0.002, drafted=DRAFTED if spec else 0,
                             accepted=ACCEPTED if spec else 0, accepted_per_pos=PER_POS if spec else None,
                             top_probs=probs)

    def top_probs(self, ids, n_probs, batch=0):
        return [(int(ids[-1]) + 1, 0.52), (45, 0.48)][:n_probs]

    def time_passes(self, ctx, prompt_id, ids):
        st, n = ctx.cfg.stage, ids.shape[1]
        mem = self.memory(ctx)
        return [TimedPass(n + int(e), role, PassTiming(int(m), base * int(m), base * int(m), base * int(m),
                                                       int(st.repeats)), mem)
                for role, base in (("target", 0.01), ("draft", 0.002)) for e in st.context_extra
                for m in st.pass_lengths]

    def step_times(self, ctx, ks, progress=None):
        return StepTimes(0.01, 0.002, {k: 0.01 * (k + 1) for k in ks})

    def memory(self, ctx):
        return {"param_devices": "stub", "rss_bytes": 7, "device_free_bytes": -1, "memory_trusted": True,
                "memory_reason": ""}


STUB = f"engine._target_={__name__}.StubEngine"
JOB = ("stage=all", "stage.parts=[timing,acceptance,speed,divergence]", "stage.ks=[2,3]", "stage.acceptance_ks=[2,3]",
       "stage.rounds=2", "stage.repeats=2", "stage.pass_lengths=[1,3]", "stage.context_extra=[0]",
       "prompts.kinds=[code]", "prompts.per_kind=2")


def _rows(cfg, part: str) -> pd.DataFrame:
    return pd.read_parquet(output_path(cfg, part))


def test_a_stub_engine_runs_timing_acceptance_speed_and_divergence(tmp_path):
    cfg = make_cfg(tmp_path, STUB, *JOB)
    run_parts(cfg)
    frames = {part: _rows(cfg, part) for part in ("timing", "acceptance", "speed", "divergence")}
    for part, df in frames.items():
        assert len(df) and set(df.engine) == {"stub"}, part
        assert set(df.dtype) == {"stub-q4"} and set(df.draft) == {"stub-draft"}, part

    timing = frames["timing"]
    assert sorted(set(zip(timing.model, timing.pass_len))) == [("draft", 1), ("draft", 3), ("target", 1), ("target", 3)]
    assert (timing.median_s == timing.pass_len * timing.model.map({"target": 0.01, "draft": 0.002})).all()
    assert (timing.samples == 2).all() and (timing.param_devices == "stub").all() and (timing.rss_bytes == 7).all()

    acc = frames["acceptance"]  # one row per request: the stub's counters
    assert len(acc) == 2 * 2 and sorted(acc.k.unique()) == [2, 3] and (acc.iteration == 0).all()
    assert (acc.proposed == DRAFTED).all() and (acc.accepted == ACCEPTED).all()
    assert (acc.new_tokens == 12).all() and (acc.draft_calls == 12 - ACCEPTED).all()
    assert (acc.wall_s == SPEC_WALL).all() and (acc.prefill_s == 0.002).all()

    speed = frames["speed"]
    spec = speed[speed.arm == "speculative"]
    assert set(speed.arm) == {"plain", "speculative"} and sorted(spec.k.unique()) == [2, 3]
    assert (spec.ratio_to_adjacent_plain - PLAIN_WALL / SPEC_WALL).abs().max() < 1e-9
    assert (spec.acceptance_rate == ACCEPTED / DRAFTED).all() and (spec.iterations == 12 - ACCEPTED).all()
    assert (spec.accepted_by_depth == ",".join(map(str, PER_POS))).all()  # the engine's counts per draft position
    assert (speed[speed.arm == "plain"].accepted_by_depth == "").all()
    assert spec[spec.k == 2].identical_to_plain.all() and not spec[spec.k == 3].identical_to_plain.any()
    assert (spec.verify_before_s == 0.01 * (spec.k + 1)).all() and (speed.target_step_after_s == 0.01).all()

    div = frames["divergence"]  # k=3 differs at token DIFF: the stub's runner-up within tie_nats
    assert len(div) == 2 * 2 * 2  # rounds x prompts x ks
    assert (div[div.k == 2].classification == "identical").all()
    tie = div[div.k == DIVERGES_AT_K]
    assert (tie.classification == "near_tie").all() and (tie.position == DIFF).all() and (tie.spec_token == 45).all()


def test_the_stub_engine_is_asked_and_closed_through_the_seam(tmp_path):
    from pipeline.jobs.context import build_context
    from pipeline.stages import acceptance, divergence

    ctx = build_context(make_cfg(tmp_path, STUB, "stage=divergence", "stage.ks=[3]", "prompts.kinds=[code]",
                                 "prompts.per_kind=1"))
    engine = ctx.runner
    assert isinstance(engine, StubEngine) and ctx.pair.target is None
    out = divergence.run(ctx)
    assert out.metrics["near_ties"] == 1
    # plain asked greedy with the top-2 of each token (the stub does not recompute logits), speculative greedy
    assert engine.requests == [("plain", None, True, 2), ("speculative", 3, True, 0)]
    rows = acceptance.rows_of(ctx, ctx.prompts)
    assert [r["proposed"] for r in rows] == [DRAFTED]
    ctx.close()
    assert engine.closed


def test_the_engine_says_which_stage_parts_it_runs(tmp_path):
    cfg = make_cfg(tmp_path, STUB, "stage=distribution")
    with pytest.raises(ConfigError, match=r"stage part distribution needs speclab's own loop .* runs \['timing'"):
        check_engine(cfg, list(cfg.stage.parts))
    cfg = make_cfg(tmp_path, STUB, *JOB)
    check_engine(cfg, list(cfg.stage.parts))


# -- no stage names an engine --------------------------------------------------------------------------------------
def engine_words() -> list[str]:
    """Every engine's name and its runner module's and class's names (pipeline/engines/base.py ENGINES)."""
    words = {"llama", "on_llama"}
    for name, path in ENGINES.items():
        module, _, cls = path.rpartition(".")
        words |= {module.rpartition(".")[0], cls}  # its package (engines.<name>) and its class
        if name != "speclab":  # "speclab" is also the library's name: its comparisons are caught below
            words.add(name)
    return sorted(words)


NAME_COMPARED = re.compile(r"""[!=]=\s*["'](%s)["']|["'](%s)["']\s*[!=]=""" % (("|".join(ENGINES),) * 2))


def engine_names_in(text: str) -> list[str]:
    found = [w for w in engine_words() if re.search(re.escape(w), text, re.IGNORECASE)]
    return found + [m.group(0) for m in NAME_COMPARED.finditer(text)]


@pytest.mark.parametrize("path", sorted((ROOT / "pipeline" / "stages").glob("*.py")), ids=lambda p: p.name)
def test_no_stage_names_an_engine(path):
    assert engine_names_in(path.read_text()) == []


def test_the_name_check_sees_an_engine():
    assert engine_names_in("if on_llama(ctx):") == ["llama", "on_llama"]
    assert engine_names_in("from engines.speclab.runner import SpeclabRunner") == ["SpeclabRunner", "engines.speclab"]
    assert engine_names_in('own = runner.name == "speclab"') == ['== "speclab"']


# -- llama.cpp's runner through the seam, its servers faked (the real ones: tests/test_llama_stages.py) -------------
class FakeServer:
    """A llama-server's /completion for top_probs: a prompt cache of the last prompt, the top-2 of the next token."""

    def __init__(self) -> None:
        self.last: list[int] = []

    def post(self, path, payload):
        prompt, same = payload["prompt"], 0
        while payload.get("cache_prompt") and same < min(len(self.last), len(prompt)) and self.last[same] == prompt[same]:
            same += 1
        self.last = list(prompt)
        return {"timings": {"prompt_n": len(prompt) - same, "prompt_ms": 1.0},
                "completion_probabilities": [{"top_logprobs": [{"id": 7, "logprob": -0.65}, {"id": 45, "logprob": -0.73}]}]}


class FakeLlamaCpp:
    """engines/llama_cpp/client.py's LlamaCppEngine without servers: the calls the runner makes, answered."""

    target = draft = "fake.gguf"

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.plain = FakeServer()

    def generate(self, arm, ids, n_new, sampling=None, n_probs=0):
        from engines.llama_cpp.client import EngineRun
        self.calls.append(("generate", arm.method, arm.k, n_probs))
        tokens = [(sum(ids) + i) % 40 for i in range(n_new)]
        spec = arm.method != "plain"
        if spec and arm.k == DIVERGES_AT_K:
            tokens[DIFF] = 45
        probs = [[(t, 0.9), (44, 0.1)] for t in tokens] if n_probs else []
        if n_probs:
            probs[DIFF] = [(tokens[DIFF], 0.52), (45, 0.48)]
        return EngineRun(tokens, SPEC_WALL if spec else PLAIN_WALL, 0.002, 0.008, len(ids),
                         drafted=DRAFTED if spec else 0, accepted=ACCEPTED if spec else 0, top_probs=probs)

    def pass_times(self, ids, extension, lengths, repeats, warmup, role="target"):
        self.calls.append(("pass_times", role))
        return {m: [0.001 * m] * repeats for m in lengths}

    def step_costs(self, ids, extension, ks, repeats, warmup):
        return 0.01, 0.002, {k: 0.01 * (k + 1) for k in ks}

    def server(self, arm=PLAIN, role="target"):
        return self.plain

    def server_pids(self):
        return []

    def close(self):
        self.calls.append(("close",))


@pytest.mark.parametrize("stage", ["timing", "acceptance", "speed", "divergence"])
def test_llama_runner_answers_the_seam_over_faked_servers(tmp_path, stage):
    import importlib

    from engines.llama_cpp.runner import LlamaRunner

    own = {"timing": ["stage.repeats=2"], "speed": ["stage.ks=[2,3]", "stage.rounds=1"]}.get(stage, ["stage.ks=[2,3]"])
    cfg = make_cfg(tmp_path, "engine=llama_cpp", f"stage={stage}", "prompts.kinds=[code]", "prompts.per_kind=1",
                   *(["stage.arms=[{ks:[2,3]}]"] if stage in ("acceptance", "speed") else []), *own)
    ctx = own_context(cfg)
    runner = LlamaRunner(**{k: v for k, v in cfg.engine.items() if k != "_target_"})
    runner.engine, runner.draft_label, runner._weights = FakeLlamaCpp(), "fake draft", "gguf:Q4_1"
    runner.model_sizes = lambda ctx=None: dict.fromkeys([f"{r}_{w}" for r in ("target", "draft")
                                                         for w in ("params", "bytes", "layers")])
    ctx.runner = runner
    rows = importlib.import_module(f"pipeline.stages.{stage}").run(ctx).rows
    assert set(rows.engine) == {"llama_cpp"} and set(rows.dtype) == {"gguf:Q4_1"} and set(rows.draft) == {"fake draft"}
    if stage == "timing":
        assert set(rows.model) == {"target", "draft"} and (rows.median_s == 0.001 * rows.pass_len).all()
    if stage == "acceptance":
        assert len(rows) == 2 and (rows.proposed == DRAFTED).all() and (rows.accepted == ACCEPTED).all()
        assert (rows.draft_calls == 12 - ACCEPTED).all()
    if stage == "speed":
        spec = rows[rows.arm == "speculative"]
        assert (spec.acceptance_rate == ACCEPTED / DRAFTED).all() and (spec.ratio_to_adjacent_plain == 2.0).all()
    if stage == "divergence":
        assert rows.set_index("k").classification.to_dict() == {2: "identical", 3: "near_tie"}
        assert ("generate", "plain", None, 2) in runner.engine.calls
