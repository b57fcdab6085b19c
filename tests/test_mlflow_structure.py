"""A 2-job sweep logged to a temporary store: one parent run, one child per job, one grandchild per arm,
the same metric names everywhere, and what tells runs apart in params and tags."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The headline first (speed-up with its interval, alpha, tokens per pass, runs), the rest grouped after as x_<name>.
HEADLINE = {"speedup", "alpha", "tokens_per_pass", "runs", "minutes", "level"}
STABLE = HEADLINE | {"x_spec_tokens_per_s", "x_plain_tokens_per_s", "x_draft_ms_per_iter", "x_verify_ms_per_iter",
                     "x_rollback_ms_per_iter", "x_bookkeeping_ms_per_iter", "x_identical_share"}
NOISE = ("outputs_dir", "force", "threads", "mlflow.tracking_uri", "mlflow.enabled", "campaign")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{tmp}/mlflow.db"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "pipeline.run", "-m", "k=1,2", "pair=tiny_random", "prompts=smoke", "stage=speed",
         "device=cpu", "max_new_tokens=8", "stage.timing_repeats=2", "stage.timing_warmup=0", "campaign=ci-check",
         "stage.rounds=2",  # three prompts, two rounds: six runs in each pooled arm, an interval at 95%
         f"outputs_dir={tmp}/outputs", f"mlflow.tracking_uri={uri}", f"hydra.sweep.dir={tmp}/sweep"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id], max_results=500)
    return res, runs, tmp, client


def _level(runs, level):
    return [r for r in runs if r.data.tags.get("level") == level]


def test_parent_child_structure(sweep):
    _, runs, _, client = sweep
    (parent,) = _level(runs, "sweep")
    jobs, arms = _level(runs, "stage"), _level(runs, "arm")
    assert parent.info.status == "FINISHED" and parent.data.tags["campaign"] == "ci-check"
    assert "k=1,2" in parent.data.tags["overrides"] and parent.data.tags["mlflow.note.content"]
    assert len(jobs) == 2 and {j.data.tags["mlflow.parentRunId"] for j in jobs} == {parent.info.run_id}
    by_job = {j.info.run_id: [a for a in arms if a.data.tags["mlflow.parentRunId"] == j.info.run_id] for j in jobs}
    # prompts=smoke holds three kinds: one arm per kind and one pooled ('all') per job
    assert all(sorted(a.data.params["kind"] for a in kids) == ["all", "code", "prose", "structured"]
               for kids in by_job.values())
    assert all(r.info.status == "FINISHED" for r in runs)
    # a job's run lasts as long as the job, not the 0.1 s it takes to log it
    assert all(j.info.end_time - j.info.start_time > 100 for j in jobs)


def test_metric_names_are_stable_and_params_tell_runs_apart(sweep):
    _, runs, _, client = sweep
    jobs, arms = _level(runs, "stage"), _level(runs, "arm")
    assert all(STABLE <= set(a.data.metrics) for a in arms)
    # every arm: the same columns in the compare view (an arm with too few runs for an interval leaves its
    # speedup_lo / speedup_hi / precision cells empty)
    interval = {"speedup_lo", "speedup_hi", "precision"}
    assert len({frozenset(a.data.metrics) - interval for a in arms}) == 1
    assert all({"runs", "minutes", "level"} <= set(a.data.metrics) for a in arms)
    assert all(STABLE <= set(j.data.metrics) and "x_drift_ratio" in j.data.metrics for j in jobs)
    assert all(not (set(r.data.metrics) - HEADLINE - interval) - {
        m for m in r.data.metrics if m.startswith("x_")} for r in jobs + arms)  # the rest is grouped after
    assert all(interval <= set(a.data.metrics) for a in arms if a.data.params["kind"] == "all")
    assert not any("." in m for r in jobs + arms for m in r.data.metrics)  # no k or kind inside a metric name
    assert sorted(j.data.params["k"] for j in jobs) == ["1", "2"]
    assert {a.data.params["k"] for a in arms} == {"1", "2"}
    for j in jobs:
        assert not any(p.startswith(NOISE) for p in j.data.params), sorted(j.data.params)
        tags = j.data.tags
        assert tags["choice.prompts"] == "smoke" and tags["campaign"] == "ci-check"
        assert tags["mlflow.source.git.commit"] and tags["cpu_model"] and tags["torch_threads"]
        # what varies first, then the prompts, the prompt set, the stage (the pair when it fits in 60 characters)
        assert j.info.run_name.startswith(f"k{j.data.params['k']} · ") and " · default · speed" in j.info.run_name
        assert len(j.info.run_name) <= 60 and tags["prompt_set"] == "default"
        assert "speed-up" in tags["mlflow.note.content"]
        files = {a.path for a in client.list_artifacts(j.info.run_id)}
        assert "config.yaml" in files and any(f.endswith(".parquet") for f in files)


def test_multirun_ends_with_one_summary_table(sweep):
    res, runs, tmp, _ = sweep
    out = res.stdout
    assert "multirun of 2 jobs" in out and "| k=1 " in out and "| k=2 " in out
    (parent,) = _level(runs, "sweep")
    assert parent.info.run_id in out
    assert (tmp / "sweep" / "0" / "run.log").read_text().count("[speed]") >= 3  # the job's log holds its output
