"""The stages on engine=llama_cpp: acceptance (one row per request), timing (the engine's own passes) and divergence
(the engine's own top-2 at the first difference) run on SmolLM2's GGUF, drafted by a copy of itself; what llama.cpp
cannot run is refused in one line before anything loads.

The end-to-end jobs need the build of ``make llama-cpp`` (marker llama_cpp: skipped without it unless
SPECLAB_REQUIRE_LLAMA=1); the refusals and the near-tie verdict need no server and run everywhere.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest

from pipeline.config.schema import SPECLAB, STAGE_SCHEMAS, ConfigError
from pipeline.engines.option_checks import ENGINE_KEYS, PLAN_PRESETS, check_engine
from pipeline.stages.divergence import engine_analyse
from engines.llama_cpp.client import EngineRun
from tests.pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]
TAG = "SPECLAB_TEST_TAG"  # in a job's environment, which its servers inherit: how a test finds its own servers
ONE_PROMPT = ("engine=llama_cpp", "pair=smollm2_int8", "prompts.kinds=[code]", "prompts.per_kind=1",
              "max_new_tokens=8", "mlflow.enabled=false")


def _job(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), TAG: tag}
    args = [sys.executable, "-m", "pipeline.run", *ONE_PROMPT, f"outputs_dir={tmp_path / 'out'}",
            f"hydra.run.dir={tmp_path / 'hydra' / tag[:8]}", "campaign=llama_stages", *overrides]
    try:
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
    finally:
        assert not _servers(tag), "a llama-server outlived its job"


def _servers(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "llama-server" and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TAG) == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _rows(tmp_path: Path, stage: str) -> pd.DataFrame:
    files = sorted((tmp_path / "out" / "campaigns" / "llama_stages" / stage).glob("*.parquet"))
    assert len(files) == 1, files
    return pd.read_parquet(files[0])


# -- refusals: one line naming the value and what is allowed, before anything loads ----------------------------------
REFUSED = {
    "distribution": (["stage=distribution"], "stage part distribution needs speclab's own loop"),
    "batch": (["stage=batch"], "stage part batch needs speclab's own loop"),
    "stage_arms": (["stage=speed", "stage.arms=[{drafter:prompt_lookup}]"],
                   "stage.arms entry {'drafter': 'prompt_lookup'}: drafter='prompt_lookup' is not a llama.cpp speculative type"),
    "peer": (["stage=speed", "stage.arms=[{},{method:hf_default}]"], "method hf_default is speclab's"),
    "bad_setting": (["stage=speed", "stage.arms=[{drafter:model,settings:{size_n:3}}]"],
                    "settings.size_n is not a setting of llama.cpp's model"),
    "drafter": (["stage=speed", "drafter=prompt_lookup"], "drafter=prompt_lookup is speclab's own drafter"),
    "k_policy": (["stage=speed", "k_policy=cost_model"], "k_policy=cost_model is speclab's own k policy"),
    "trees": (["stage=acceptance", "stage.arms=[{tree:'static:2-1'}]"], "tree is speclab's; llama.cpp drafts chains"),
    "k_policies": (["stage=acceptance", "stage.arms=[{k_policy:cost_model}]"], "k_policy is speclab's"),
    "prefill": (["stage=timing", "stage.prefill=true"], "stage.prefill=true"),
    "tree_nodes": (["stage=timing", "stage.tree_nodes=[3]"], "stage.tree_nodes=[3]"),
    "tie_ulps": (["stage=divergence", "stage.tie_ulps=8"], "stage.tie_ulps=8"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_llama_refuses_what_it_cannot_run(tmp_path, case):
    overrides, said = REFUSED[case]
    cfg = make_cfg(tmp_path, "engine=llama_cpp", *overrides)
    with pytest.raises(ConfigError) as err:
        check_engine(cfg, list(cfg.stage.parts))
    line = str(err.value)
    assert said in line and "\n" not in line


# A value set for each stage key only speclab's loop reads (the schema's ``engine=SPECLAB``): a key declared so is
# refused under llama.cpp, and this table says with what.
SPECLAB_SET = {"prefill": "true", "tree_nodes": "[3]", "tie_ulps": "8"}


def test_the_keys_only_speclab_reads_are_declared_in_the_schema():
    assert set(ENGINE_KEYS[SPECLAB]) == set(SPECLAB_SET)
    assert set(PLAN_PRESETS) == {"prefill"}  # conf/stage/plan.yaml's (its arms: arm_list, the engine's own)


@pytest.mark.parametrize("key", sorted(SPECLAB_SET))
def test_llama_refuses_each_key_only_speclab_reads(tmp_path, key):
    stage = next(name for name, schema in STAGE_SCHEMAS.items() if key in schema.__dataclass_fields__)
    cfg = make_cfg(tmp_path, "engine=llama_cpp", f"stage={stage}", f"stage.{key}={SPECLAB_SET[key]}")
    with pytest.raises(ConfigError, match=rf"^stage\.{key}=") as err:
        check_engine(cfg, list(cfg.stage.parts))
    assert "\n" not in str(err.value)
    check_engine(make_cfg(tmp_path, f"stage={stage}", f"stage.{key}={SPECLAB_SET[key]}"), [stage])  # speclab: runs


def test_tie_nats_is_refused_under_speclab(tmp_path):
    cfg = make_cfg(tmp_path, "stage=divergence", "stage.tie_nats=1.0")
    with pytest.raises(ConfigError, match=r"stage.tie_nats=1.0 is read only under engine=llama_cpp"):
        check_engine(cfg, list(cfg.stage.parts))


@pytest.mark.parametrize("overrides", [["stage=quick"], ["stage=speed", "stage.arms=[{},{method:recommended}]"],
                                       ["stage=timing"], ["stage=divergence"], ["stage=plan"],
                                       ["stage=acceptance", "sampling=t07"]])
def test_llama_takes_its_stages(tmp_path, overrides):
    cfg = make_cfg(tmp_path, "engine=llama_cpp", *overrides)
    check_engine(cfg, list(cfg.stage.parts))


def test_refusal_is_one_line_before_any_server(tmp_path):
    """The command line says it in one line, exit 2, before a model or a server is loaded."""
    done = subprocess.run([sys.executable, "-m", "pipeline.run", "engine=llama_cpp", "stage=distribution",
                           "mlflow.enabled=false", f"outputs_dir={tmp_path / 'out'}",
                           f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert lines == [lines[0]] and lines[0].startswith("speclab: error: stage part distribution needs speclab's "
                                                       "own loop"), done.stderr
    assert "loading" not in done.stdout + done.stderr


# -- divergence's verdict from the engine's own top-2 ------------------------------------------------------------------
def _ctx(recomputed: list[tuple[int, float]], tie_nats: float = 0.5):
    runner = SimpleNamespace(top_probs=lambda ids, n, batch=0: recomputed)
    return SimpleNamespace(runner=runner, pair=SimpleNamespace(tokenizer=None),
                           cfg=SimpleNamespace(stage=SimpleNamespace(tie_nats=tie_nats)))


def _plain(tokens: list[int], probs_at_2: list[tuple[int, float]]) -> EngineRun:
    probs = [[(t, 0.9), (99, 0.05)] for t in tokens]
    probs[2] = probs_at_2
    return EngineRun(tokens, 0.1, 0.01, 0.09, 5, top_probs=probs)


def test_runner_up_within_tie_nats_is_a_near_tie():
    plain = _plain([1, 2, 3, 4], [(3, 0.40), (7, 0.36)])
    row = engine_analyse(_ctx([(3, 0.40), (7, 0.36)]), [0], plain, [1, 2, 7, 4], k=2)
    assert row["position"] == 2 and row["plain_token"] == 3 and row["spec_token"] == 7
    assert row["gap_single_step"] == pytest.approx(math.log(0.40 / 0.36))
    assert row["max_gap"] == pytest.approx(math.log(0.40 / 0.36)) and row["classification"] == "near_tie"


def test_token_outside_the_top_two_is_not_a_near_tie():
    plain = _plain([1, 2, 3, 4], [(3, 0.40), (8, 0.39)])
    row = engine_analyse(_ctx([(3, 0.40), (8, 0.39)]), [0], plain, [1, 2, 7, 4], k=2)
    assert row["classification"] == "bug" and math.isnan(row["gap_single_step"])


def test_wide_gap_is_a_bug_unless_a_batch_shape_ranks_it_first():
    plain = _plain([1, 2, 3, 4], [(3, 0.80), (7, 0.10)])
    assert engine_analyse(_ctx([(3, 0.80), (7, 0.10)]), [0], plain, [1, 2, 7, 4], k=2)["classification"] == "bug"
    flipped = engine_analyse(_ctx([(7, 0.50), (3, 0.45)]), [0], plain, [1, 2, 7, 4], k=2)
    assert flipped["classification"] == "near_tie" and flipped["gap_verify_pass"] < 0


def test_identical_outputs_give_a_short_record():
    plain = _plain([1, 2, 3], [(3, 0.9), (4, 0.1)])
    assert engine_analyse(_ctx([]), [0], plain, [1, 2, 3], k=2) == {"identical": True, "position": -1,
                                                                     "classification": "identical"}


# -- the stages end to end on a real llama-server ----------------------------------------------------------------------
@pytest.mark.llama_cpp
@pytest.mark.slow
def test_default_job_runs_acceptance_per_request(tmp_path):
    done = _job(tmp_path)  # stage quick: acceptance and speed, stage.arms at the engine's default
    assert done.returncode == 0, done.stderr[-2000:]
    acc = _rows(tmp_path, "acceptance")
    assert set(acc.engine) == {"llama_cpp"} and set(acc.drafter) == {"model", "ngram-simple"}
    model = acc[acc.drafter == "model"]
    assert len(model) == 1 and model.iteration.tolist() == [0]  # one request: one row
    assert model.proposed.sum() > 0 and model.accepted.sum() / model.proposed.sum() > 0.9  # a copy drafts itself
    assert (acc.length == acc.prompt_len + acc.new_tokens).all() and (acc.draft_calls > 0).all()
    said = done.stdout + done.stderr
    assert "[acceptance] llama_cpp draft model k=4: alpha 1.000" in said
    assert "per request" in said and "per iteration draft nan" not in said
    assert set(_rows(tmp_path, "speed").engine) == {"llama_cpp"}


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_timing_times_the_engines_passes(tmp_path):
    done = _job(tmp_path, "stage=timing", "stage.repeats=2", "stage.warmup=0", "stage.pass_lengths=[1,3]",
                "stage.context_extra=[0,20]")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(tmp_path, "timing")
    assert set(rows.engine) == {"llama_cpp"} and len(rows) == 2 * 2 * 2  # model x context x pass_len
    assert sorted(rows.pass_len.unique()) == [1, 3] and rows.context_len.nunique() == 2
    assert (rows.samples == 2).all() and (rows.median_s > 0).all()
    assert (rows.target_bytes > 0).all() and (rows.target_layers == 30).all() and rows.target_params.isna().all()


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_divergence_compares_with_the_plain_server(tmp_path):
    done = _job(tmp_path, "stage=divergence", "stage.ks=[2]")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(tmp_path, "divergence")
    assert set(rows.engine) == {"llama_cpp"} and len(rows) == 1 and rows.k.tolist() == [2]
    assert set(rows.classification) <= {"identical", "length_only", "near_tie", "bug"}


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_plan_grows_its_sample_in_the_engine(tmp_path):
    """The plan on llama.cpp adds a kind's next prompt as speclab's loop does (the engine makes its context), one
    request per candidate on it, and says why the sample stopped."""
    done = _job(tmp_path, "stage=plan", "stage.repeats=2", "stage.warmup=0", "stage.pass_lengths=[1,3]",
                "stage.context_extra=[0]", "stage.prefill=false", "stage.sample_max_prompts=2")
    assert done.returncode == 0, done.stderr[-2000:]
    acc, plan = _rows(tmp_path, "acceptance"), _rows(tmp_path, "plan")
    assert set(acc.engine) == {"llama_cpp"} and acc.prompt_id.nunique() == 2  # one prompt never settles a kind
    assert acc.groupby("prompt_id").size().nunique() == 1  # every candidate on the added prompt too
    rec = plan[plan.recommended & (plan.kind == "code")].iloc[0]
    assert rec.prompts == 2 and (rec.sample_stop.startswith("settled at 2")
                                 or "stage.sample_max_prompts=2" in rec.sample_stop)
    assert _rows(tmp_path, "timing").prompt_id.nunique() == 1  # passes timed once
