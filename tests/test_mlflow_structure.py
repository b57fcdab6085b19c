"""A 2-job sweep logged to a temporary store: one parent run, one child per job, one grandchild per arm,
the same metric names everywhere, and what tells runs apart in params and tags."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The headline first (speed-up with its interval, alpha, tokens per pass, runs, trusted), the rest grouped after as
# x_<name> (the interval's level and half-width, the minutes).
HEADLINE = {"speedup", "alpha", "tokens_per_pass", "runs", "trusted"}
STABLE = HEADLINE | {"x_spec_tokens_per_s", "x_plain_tokens_per_s", "x_draft_ms_per_iter", "x_verify_ms_per_iter",
                     "x_rollback_ms_per_iter", "x_bookkeeping_ms_per_iter", "x_identical_share", "x_minutes",
                     "x_level"}
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
    # the sweep's run: what it varies in its name, and metrics of its own (its fastest job's headline)
    assert parent.info.run_name.startswith("sweep k=1,2 · ci-check · ")
    assert parent.data.metrics["sweep_jobs"] == 2 and "sweep_trusted_jobs" in parent.data.metrics
    fastest = max(_level(runs, "stage"), key=lambda j: j.data.metrics["speedup"])
    assert parent.data.metrics["speedup"] == fastest.data.metrics["speedup"]
    # MLflow 3 opens an experiment of this kind on its runs, not on the GenAI overview
    assert client.get_experiment_by_name("speclab").tags["mlflow.experimentKind"] == "custom_model_development"
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
    interval = {"speedup_lo", "speedup_hi", "x_precision"}
    assert len({frozenset(a.data.metrics) - interval for a in arms}) == 1
    assert all({"runs", "x_minutes", "x_level", "trusted"} <= set(a.data.metrics) for a in arms)
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
        assert j.data.params["trust"] == tags["trust"]  # the compare view lists params, not tags
        assert tags["mlflow.source.git.commit"] and tags["cpu_model"] and tags["torch_threads"]
        # what varies first, then the prompts, the prompt set used (prompts=smoke, not its file's default.yaml),
        # the stage (the pair when it fits in 60 characters)
        assert j.info.run_name.startswith(f"k{j.data.params['k']} · ") and " · smoke · speed" in j.info.run_name
        assert len(j.info.run_name) <= 60 and tags["prompt_set"] == "smoke"
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


def test_headline_metrics_are_rounded_for_display_and_exact_in_parquet(sweep):
    import pandas as pd

    _, runs, tmp, _ = sweep
    for j in _level(runs, "stage"):
        shown = j.data.metrics["speedup"]
        assert shown == float(f"{shown:.3g}")  # three significant digits in MLflow
        (path,) = (tmp / "outputs").rglob(f"*{j.data.tags['config_hash']}*.parquet")
        rows = pd.read_parquet(path)
        exact = rows[(rows.arm != "plain")].ratio_to_adjacent_plain.median()
        # the file keeps every digit
        assert abs(exact - shown) <= 0.0051 * abs(exact) and exact != float(f"{exact:.3g}")


def test_the_experiment_is_of_the_classic_ml_kind_new_or_existing(tmp_path):
    """MLflow 3's UI reads ``mlflow.experimentKind``: a new experiment gets the classic-ML kind, an existing one
    without a kind gets it when first used, and a kind chosen by the user stays."""
    import mlflow

    from pipeline.tracking.mlflow_runs import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    client.create_experiment("old")
    client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    for name in ("new", "old", "chosen"):
        Tracker(uri, name, True).call(lambda c: None)
    kinds = {n: client.get_experiment_by_name(n).tags.get("mlflow.experimentKind") for n in ("new", "old", "chosen")}
    assert kinds == {"new": "custom_model_development", "old": "custom_model_development",
                     "chosen": "genai_development"}


def test_two_sweeps_started_in_the_same_second_get_names_of_their_own(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    import pipeline.jobs.sweep as tracking

    for var in (tracking.PARENT_ENV, tracking.PARENT_URI_ENV, tracking.SWEEP_PID_ENV, tracking.SWEEP_DIR_ENV,
                tracking.SWEPT_ENV):
        monkeypatch.setenv(var, "")  # restored after the test: on_multirun_start sets them
    monkeypatch.setattr(tracking.time, "strftime", lambda fmt, *a: "2026-01-01 12:00:00")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = OmegaConf.create({"campaign": "c", "hydra": {
        "sweep": {"dir": str(tmp_path / "multirun" / "2026-01-01" / "12-00-00")}, "runtime": {"choices": {}},
        "overrides": {"task": ["k=2,4", "pair=tiny_random"]}, "sweeper": {"params": {"seed": "1,2"}}}})
    names = []
    for _ in range(2):
        sweep = tracking.CreateTrackingStore(uri)
        sweep.on_multirun_start(config)
        names.append(sweep.tracker.call(lambda c: c.get_run(sweep.parent).info.run_name))
        sweep.tracker.end(sweep.parent, "FINISHED")
    tracking._multirun.pop("callback", None)
    assert names[0] == "sweep k=2,4 · c · 2026-01-01 12:00:00" and names[1] == f"{names[0]} #2"
    assert os.environ[tracking.SWEPT_ENV] == "k seed"  # for the jobs' run names
