"""Job-time trust checks (pipeline/jobs/trust.py): the pure checks at their limits, a speed job on a faked loaded and
drifting machine warned in the console, MLflow and Parquet, a clean job ok, the torch_threads tag, intervals
that need runs, the headline metric names, run names, and the browser check's run selection."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
import yaml

from pipeline.jobs import trust
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from engines.speclab import runner as engine_speclab
from pipeline.stages import speed, timing
from pipeline.tracking.mlflow_view import rounded
from pipeline.jobs.run_names import arm_run_name, grouped_metrics, run_name, shown_metrics
from pipeline.stages.shared import speedup_metrics, speedup_text
from pipeline_helpers import make_cfg

ROOT = Path(__file__).resolve().parents[1]


# ---- the pure checks: exactly at the limit passes, just above fails ---------------------------------------

def test_drift_check_boundary():
    assert trust.check_drift(1.25, 1.25) is None and trust.check_drift(0.9, 1.25) is None
    failed = trust.check_drift(1.2501, 1.25)
    assert failed.name == "drift" and "x1.25" in failed.reason and "limit x1.25" in failed.reason
    assert trust.check_drift(float("nan"), 1.25) is None  # no step times: nothing to check


def test_load_check_boundary():
    """Without own threads the limit is the cores plus the tolerance; exactly at it passes."""
    assert trust.check_load([0.5, 2.5, 1.0], 2) is None
    failed = trust.check_load([0.5, 2.51, 1.0], 2)
    assert failed.name == "load" and "2.51" in failed.reason and "2 usable cores" in failed.reason
    assert trust.check_load([], 2) is None


def test_load_check_discounts_the_jobs_own_threads():
    """A job of two threads on two idle cores reads about 2: its own load is no warning; a second busy process
    (one more thread) is, and so is half a thread more than the cores the job leaves free."""
    assert trust.check_load([2.06], 2, own_threads=2) is None
    failed = trust.check_load([3.1], 2, own_threads=2)
    assert failed.name == "load" and "1.10 beyond its own 2 threads" in failed.reason
    assert trust.check_load([4.0], 16, own_threads=2) is None  # 14 cores left free
    assert trust.check_load([16.6], 16, own_threads=2) is not None
    assert trust.check_load([4.4], 2, own_threads=4) is None  # an oversubscribed job's own threads are its own


def test_runs_check_boundary():
    assert trust.check_runs(3, 3) is None
    failed = trust.check_runs(2, 3)
    assert failed.name == "runs" and "2 runs per arm" in failed.reason and "fewer than trust.min_runs = 3" in failed.reason


def test_placement_check():
    assert trust.check_placement([True, True], ["ok", "ok"]) is None
    failed = trust.check_placement([True, False], ["ok", "parameters on ['cpu'], expected cuda"])
    assert failed.name == "placement" and "expected cuda" in failed.reason and "1 of 2 rows" in failed.reason


def test_verdict_joins_names_and_reasons():
    assert trust.verdict([]) == ("ok", "")
    tag, detail = trust.verdict([trust.Failed("drift", "a"), trust.Failed("load", "b")])
    assert tag == "drift,load" and detail == "a; b"


def test_usable_cores_is_the_affinity_mask():
    assert trust.usable_cores() == len(os.sched_getaffinity(0))


def test_load_sampler_tags_max_and_median(monkeypatch):
    loads = iter([1.0, 5.0, 2.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    s = trust.LoadSampler()
    for _ in range(3):
        s.sample()
    assert s.tags() == {"load_max": "5.00", "load_median": "2.00", "load_samples": "3"}


def test_other_processes_cpu_share_fails_the_load_check_beyond_what_the_job_leaves_free():
    assert trust.check_other_cpu([0.1, 0.5], 2, own_threads=2) is None  # at the limit passes
    failed = trust.check_other_cpu([0.1, 0.8], 2, own_threads=2)
    assert failed.name == "load" and "0.80 cores busy" in failed.reason and "2 usable cores" in failed.reason
    assert trust.check_other_cpu([1.2], 4, own_threads=2) is None and trust.check_other_cpu([], 2) is None


def test_the_sampler_measures_other_processes_cpu_between_samples_a_second_apart(monkeypatch):
    snaps = iter([trust.CpuSnapshot(0.0, 100.0, 10.0), trust.CpuSnapshot(0.5, 101.0, 10.5),  # too close: skipped
                  trust.CpuSnapshot(10.0, 120.0, 22.0), trust.CpuSnapshot(20.0, 130.0, 32.0)])
    monkeypatch.setattr(trust, "cpu_snapshot", lambda: next(snaps))
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    s = trust.LoadSampler()
    for _ in range(4):
        s.sample()
    # 20 busy seconds over 10, 12 of them the job's: 0.8 cores; then the job alone
    assert s.others == pytest.approx([0.8, 0.0]) and s.tags()["other_cpu_max"] == "0.80"


def test_the_jobs_own_cpu_and_its_childrens_is_not_other_work():
    """What the job burns itself, and what a child (a server engine's process) burned, count as its own."""
    import subprocess
    import sys
    import time

    before = trust.cpu_snapshot()
    start = time.process_time()
    while time.process_time() - start < 0.5:  # half a CPU second in this process
        pass
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: "
                                          "pass"], check=True)  # and half in a child, ended and waited for
    after = trust.cpu_snapshot()
    assert after.own_s - before.own_s >= 0.95
    assert after.busy_s - before.busy_s >= 0.95  # the machine saw it busy too


def test_a_busy_process_beside_the_job_shows_at_once_where_the_load_average_lags():
    """A real CPU-bound process for 2 seconds: the load average has barely moved, the CPU share has."""
    import subprocess
    import sys
    import time

    s = trust.LoadSampler()
    s.sample()
    # started through a shell that exits at once: an orphan, not the job's child (a server engine's would be its own)
    subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'import time\nt = time.time()\nwhile time.time() - t < 2.5: "
                                "pass' >/dev/null 2>&1 &"], check=True)
    time.sleep(2.0)
    s.sample()
    assert s.others and s.others[0] > 0.6


# ---- the limits are config, at the analysis's values, and leave earlier jobs' hashes alone ---------------

def test_drift_limit_agrees_with_the_analysis_and_is_hash_neutral(tmp_path):
    from pipeline.config.schema import HASH_NEUTRAL, VOLATILE

    cfg = make_cfg(tmp_path, "stage=speed")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert cfg.trust.max_drift == params["drift"]["max_ratio"]
    assert HASH_NEUTRAL["trust.max_drift"].value == cfg.trust.max_drift
    assert HASH_NEUTRAL["trust.min_runs"].value == cfg.trust.min_runs
    from pipeline.jobs.identity import plain_config
    from store.identity import config_hash

    def identity_hash(config: dict) -> str:
        return config_hash(config, neutral=HASH_NEUTRAL, volatile=VOLATILE)

    plain = plain_config(cfg)  # its arms as the job runs them
    before = {k: v for k, v in plain.items() if k != "trust"}  # a config from before the knobs
    assert identity_hash(plain) == identity_hash(before)
    changed = plain_config(make_cfg(tmp_path, "stage=speed", "trust.min_runs=5"))
    assert identity_hash(changed) != identity_hash(plain)


def test_old_files_read_unchecked():
    from store.compat import complete_table, later_missing

    old = pa.schema([f for f in timing.SCHEMA if f.name not in ("trust", "trust_detail")])
    assert later_missing(old, timing.SCHEMA) == ["trust", "trust_detail"]
    table = complete_table(pa.Table.from_pylist([{}], schema=old), timing.SCHEMA)
    assert table.column("trust").to_pylist() == ["unchecked"] and table.column("trust_detail").to_pylist() == [""]


# ---- a speed job on a deliberately loaded, drifting machine -------------------------------------------------

JOB = ("stage=speed", "prompts.kinds=[code]", "prompts.per_kind=3", "stage.timing_repeats=1", "stage.timing_warmup=0",
       "max_new_tokens=6")


def _fake_machine(monkeypatch, load: float, drift: float) -> None:
    """The load average every sample reads (and no CPU share: the test suite's other workers are not the job's
    machine), and step times after the runs ``drift`` times those before."""
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(trust, "cpu_snapshot", lambda: None)
    calls = []

    def step_times(ctx, ks, progress=None):
        calls.append(progress)
        f = 1.0 if len(calls) == 1 else drift
        return 0.010 * f, 0.002 * f, {k: 0.012 * f for k in ks}

    monkeypatch.setattr(engine_speclab, "step_times", step_times)


def _stage_runs(uri: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("speclab")
    runs = client.search_runs([exp.experiment_id], "tags.stage = 'speed'")
    return ([r for r in runs if r.data.tags["level"] == "stage"], [r for r in runs if r.data.tags["level"] == "arm"])


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_a_loaded_drifting_machine_is_warned_in_console_mlflow_and_parquet(tmp_path, monkeypatch, caplog,
                                                                           restore_threads):
    cores = trust.usable_cores()
    _fake_machine(monkeypatch, load=cores + 7.0, drift=2.0)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *JOB, "threads=1", "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    with caplog.at_level(logging.WARNING, logger="speclab"):
        run_parts(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("drift" in w and "x2.00" in w and "x1.25" in w for w in warnings), warnings
    assert any("load" in w and f"{cores + 7.0:.2f}" in w and f"{cores} usable cores" in w for w in warnings), warnings

    df = pd.read_parquet(output_path(cfg, "speed"))
    assert (df.trust == "drift,load").all()
    assert df.trust_detail.str.contains("x2.00").all() and df.trust_detail.str.contains("load average").all()

    [stage], arms = _stage_runs(uri)
    assert stage.data.tags["trust"] == "drift,load"
    assert "WARNING trust=drift,load" in stage.data.tags["mlflow.note.content"]
    assert arms and all(a.data.tags["trust"] == "drift,load" for a in arms)
    assert stage.data.tags["load_max"] == f"{cores + 7.0:.2f}" and int(stage.data.tags["load_samples"]) >= 3
    assert stage.data.metrics["x_drift_ratio"] == pytest.approx(2.0)


def test_a_clean_job_is_trusted(tmp_path, monkeypatch, restore_threads):
    _fake_machine(monkeypatch, load=0.0, drift=1.0)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *JOB, "threads=1", "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    df = pd.read_parquet(output_path(cfg, "speed"))
    assert (df.trust == "ok").all() and (df.trust_detail == "").all()
    [stage], _ = _stage_runs(uri)
    assert stage.data.tags["trust"] == "ok" and "trust: ok" in stage.data.tags["mlflow.note.content"]


def test_one_run_per_arm_fails_the_runs_check_and_prints_no_interval(tmp_path, monkeypatch, caplog, restore_threads):
    _fake_machine(monkeypatch, load=0.0, drift=1.0)
    cfg = make_cfg(tmp_path, *JOB, "prompts.per_kind=1", "threads=1", "stage.rounds=1")
    with caplog.at_level(logging.INFO, logger="speclab"):
        run_parts(cfg)
    assert set(pd.read_parquet(output_path(cfg, "speed")).trust) == {"runs"}
    lines = [r.getMessage() for r in caplog.records]
    assert any("speed-up" in m and "n=1, no interval" in m for m in lines), lines
    assert not any("IQR" in m for m in lines)


def test_a_file_logged_later_keeps_its_verdict(tmp_path, monkeypatch, restore_threads):
    """A job that wrote its file with tracking off: the run logged from the file later carries its verdict."""
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    small = ("stage=timing", "stage.repeats=3", "stage.warmup=0", "stage.pass_lengths=[1]", "threads=1")
    cfg = make_cfg(tmp_path, *small)
    run_parts(cfg)
    assert set(pd.read_parquet(output_path(cfg, "timing")).trust) == {"load"}
    from pipeline.tracking.machine import cpu_model
    from store.records import read_meta

    assert read_meta(output_path(cfg, "timing"))["machine"] == f"{cpu_model()}, {trust.usable_cores()} cores"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_parts(make_cfg(tmp_path, *small, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}"))
    import mlflow

    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("speclab").experiment_id], "tags.level = 'stage'")
    assert run.data.tags["logged_from_file"] == "true" and run.data.tags["trust"] == "load"
    assert "WARNING trust=load: load: load average reached 99.00" in run.data.tags["mlflow.note.content"]


def test_torch_threads_tag_is_what_the_job_ran_with(tmp_path, monkeypatch, restore_threads):
    torch.set_num_threads(2)  # the process's default, before the job asks for 1
    seen = []
    real = timing.run
    monkeypatch.setattr(timing, "run", lambda ctx: seen.append(torch.get_num_threads()) or real(ctx))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, "stage=timing", "stage.repeats=3", "stage.warmup=0", "stage.pass_lengths=[1]",
                   "threads=1", "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id])
    assert seen == [1]
    levels = {r.data.tags["level"]: r.data.tags["torch_threads"] for r in runs}
    assert levels == {"job": "1", "stage": "1"}


# ---- intervals, metric names, run names ---------------------------------------------------------------------

def _runs(ratios):
    n = len(ratios)
    return (pd.DataFrame({"ratio_to_adjacent_plain": ratios, "tokens_per_s": [10.0] * n, "block": range(n)}),
            pd.DataFrame({"tokens_per_s": [10.0] * n, "block": range(n)}))


def test_an_interval_needs_the_minimum_runs():
    m = speedup_metrics(*_runs([1.27]), 3)
    assert m["runs"] == 1 and np.isnan(m["speedup_lo"]) and np.isnan(m["speedup_hi"])
    assert "n=1, no interval" in speedup_text(m) and "1.27-1.27" not in speedup_text(m)
    m = speedup_metrics(*_runs([1.0, 1.2, 1.4]), 3)  # trust.min_runs met, but three runs hold no 95% interval
    assert np.isnan(m["speedup_lo"]) and "n=3, no interval" in speedup_text(m)
    m = speedup_metrics(*_runs([1.0, 1.2, 1.4, 1.1, 1.3, 1.25]), 3)
    assert (m["speedup_lo"], m["speedup_hi"]) == (1.0, 1.4)  # six runs: their range
    assert "95% CI 1.00-1.40" in speedup_text(m) and "n=6" in speedup_text(m)
    assert np.isnan(speedup_metrics(*_runs([1.0, 1.2, 1.4, 1.1, 1.3, 1.25]), 7)["speedup_lo"])  # min_runs still gates


def test_headline_metrics_come_first_and_the_rest_is_grouped():
    metrics = {"speedup_q25": 1, "drift_ratio": 1, "speedup": 1, "alpha": 1, "speedup_lo": 1, "speedup_hi": 1,
               "tokens_per_pass": 1, "runs": 3, "spec_tokens_per_s": 1, "level": 0.95, "minutes": 2, "precision": 1}
    logged = grouped_metrics(metrics, "speed")
    assert list(logged)[:6] == ["speedup", "speedup_lo", "speedup_hi", "runs", "alpha", "tokens_per_pass"]
    assert set(list(logged)[6:]) == {"x_speedup_q25", "x_drift_ratio", "x_spec_tokens_per_s", "x_level", "x_minutes",
                                     "x_precision"}
    assert sorted(logged)[:6] == sorted(list(logged)[:6])  # listed by name, the headline still comes first
    assert grouped_metrics({"c_draft": 0.1}, "timing") == {"c_draft": 0.1}


def test_headline_metrics_are_rounded_for_display_only():
    shown = shown_metrics({"speedup": 1.234567, "speedup_lo": 0.0729594, "runs": 1234.0, "alpha": float("nan"),
                           "x_spec_tokens_per_s": 12.345678})
    assert shown["speedup"] == 1.23 and shown["speedup_lo"] == 0.073 and shown["runs"] == 1234.0
    assert np.isnan(shown["alpha"]) and shown["x_spec_tokens_per_s"] == 12.345678  # the details stay exact
    assert rounded(0.0) == 0.0 and rounded(-98765.4) == -98765.0 and rounded(0.95) == 0.95


def test_run_names_put_what_varies_first_and_name_the_prompt_set(tmp_path):
    # Outside Hydra (no prompts choice known) the prompt file's own name, without its folder
    cfg = make_cfg(tmp_path, "stage=speed", "k=2", "sampling=t07", "prompts=spec_bench", "pair.draft_dtype=int8")
    name = speed.describe(cfg)
    assert name.startswith("k2 T0.7 draft=int8 · ") and " · question · speed" in name and len(name) <= 60
    cfg = make_cfg(tmp_path, "stage=speed", "k=2", f"prompts.file={tmp_path / 'my_folder' / 'my_prompts.jsonl'}")
    name = speed.describe(cfg)
    assert " · my_prompts · speed" in name and "my_folder" not in name
    assert arm_run_name(cfg, "speed", "speculative k2 code").startswith("speculative k2 code · my_prompts · ")
    cfg = make_cfg(tmp_path, "stage=speed", "k=3", "prompts.kinds=[code]")
    assert speed.describe(cfg) == "k3 · code[1] · default · speed · tiny_random"  # its file: default.yaml
    assert run_name(cfg, "timing").startswith("code[1] · default · timing")
    assert arm_run_name(cfg, "speed", "speculative k3 code") == "speculative k3 code · default · speed · tiny_random"


def test_run_names_say_the_prompt_set_chosen_and_what_a_sweep_varies(tmp_path, monkeypatch):
    from pipeline.tracking import mlflow_view

    class Hydra:  # HydraConfig.get() of a multirun's job: prompts=smoke chosen, seed swept
        runtime = SimpleNamespace(choices={"prompts": "smoke"})
        overrides = SimpleNamespace(task=["prompts=smoke", "seed=2", "k=3"])

    monkeypatch.setattr(mlflow_view, "_hydra", lambda: Hydra)
    monkeypatch.setenv(mlflow_view.SWEPT_ENV, "seed k")
    cfg = make_cfg(tmp_path, "stage=speed", "k=3", "seed=2")
    assert speed.describe(cfg).startswith("seed=2 k3 · ") and " · smoke · speed" in speed.describe(cfg)
    Hydra.overrides = SimpleNamespace(task=["prompts=smoke", f"prompts.file={tmp_path}/x/mine.jsonl"])
    cfg = make_cfg(tmp_path, "stage=speed", f"prompts.file={tmp_path}/x/mine.jsonl")
    assert " · mine · speed" in speed.describe(cfg)  # a file named on the command line names itself
    assert mlflow_view.swept_keys(["k=2,4", "pair=tiny_random", "seed=range(3)"], {"round": "0,1", "pair": "x"}) == [
        "k", "seed", "round"]


# ---- the browser check compares only FINISHED runs of one prompt set -----------------------------------------

def _run(status: str, k: str, prompt_set: str = "default", kinds: str = "prose,code"):
    return SimpleNamespace(info=SimpleNamespace(status=status, run_id=f"{status}-{k}-{prompt_set}"),
                           data=SimpleNamespace(params={"k": k}, tags={"prompt_set": prompt_set, "prompts": kinds}))


def test_ui_check_compares_finished_runs_of_one_prompt_set():
    from benchmarks.mlflow_ui_check import select_runs

    runs = [_run("RUNNING", "1"), _run("FINISHED", "2"), _run("FINISHED", "3", "spec_bench"), _run("FAILED", "5"),
            _run("FINISHED", "4", kinds="code"), _run("FINISHED", "6")]
    assert [r.info.run_id for r in select_runs(runs)] == ["FINISHED-2-default", "FINISHED-6-default"]
    runs += [_run("FINISHED", "10"), _run("FINISHED", "12")]  # three k values at most, in k's order
    assert [r.info.run_id for r in select_runs(runs)] == ["FINISHED-2-default", "FINISHED-6-default",
                                                         "FINISHED-10-default"]
    with pytest.raises(SystemExit, match="found 1"):
        select_runs([_run("RUNNING", "1"), _run("FINISHED", "2"), _run("FINISHED", "3", "spec_bench")])
    with pytest.raises(SystemExit, match="no FINISHED"):
        select_runs([_run("RUNNING", "1"), _run("RUNNING", "2")])


# ---- the analysis flags jobs whose own checks failed --------------------------------------------------------

def _speed_rows(trusts):
    rows = []
    for i, t in enumerate(trusts):
        rows.append({"pair": "p", "config_hash": f"h{i}", "round": 0, "kind": "code", "arm": "plain",
                     "target_step_before_s": 1.0, "target_step_after_s": 1.0, "draft_step_before_s": 1.0,
                     "draft_step_after_s": 1.0, **({"trust": t} if t is not None else {})})
    return pd.DataFrame(rows)


def test_drift_table_flags_untrusted_jobs_and_keeps_old_ones():
    from analysis.drift import drift_table, drop_drifted

    speed_rows = _speed_rows(["ok", "unchecked", "load", "runs,placement", "drift", "load,runs"])
    table = drift_table(speed_rows, 1.25)
    # Placement makes numbers wrong (flagged, dropped); drift is judged from the times at the analysis's own limit
    # (equal times here); load and few runs are shown, not dropped.
    assert table.set_index("config_hash").flagged.to_dict() == {"h0": False, "h1": False, "h2": False, "h3": True,
                                                                "h4": False, "h5": False}
    assert table.set_index("config_hash").trust["h3"] == "runs,placement"
    assert sorted(drop_drifted(speed_rows, table).config_hash) == ["h0", "h1", "h2", "h4", "h5"]
    old = _speed_rows([None, None]).assign(target_step_after_s=[1.0, 1.3])  # files before the checks
    table = drift_table(old, 1.25)
    assert table.flagged.tolist() == [False, True] and set(table.trust) == {"unchecked"}
