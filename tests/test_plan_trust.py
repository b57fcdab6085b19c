"""A plan priced on an untrusted timing or acceptance part says so wherever a person looks (its rows, console lines,
MLflow run, analysis.recommend), with the command that retimes it; with trust.strict=true it refuses in one line."""
import logging
import os

import pandas as pd
import pytest

from pipeline.jobs import trust
from pipeline.jobs.identity import output_path
from pipeline.jobs.trust import inherited
from pipeline.run import run_parts
from tests.pipeline_helpers import make_cfg

PLAN = ("stage=plan", "stage.repeats=3", "stage.warmup=0", "stage.pass_lengths=[1,2]", "stage.acceptance_ks=[1,2]",
        "prompts=default", "prompts.kinds=[code]", "prompts.per_kind=2", "stage.sample_precision=null", "threads=1")


def test_a_plan_inherits_its_parts_failed_checks():
    ok = pd.DataFrame({"trust": ["ok"], "trust_detail": [""]})
    loaded = pd.DataFrame({"trust": ["load"], "trust_detail": ["load: load average reached 9.00"]})
    assert inherited({"timing": ok, "acceptance": ok}) == ("ok", "")
    assert inherited({"timing": loaded, "acceptance": ok}) == ("load", "timing: load: load average reached 9.00")
    assert inherited({"timing": ok, "acceptance": pd.DataFrame()})[0] == "unchecked"  # written before the checks


@pytest.fixture
def busy(monkeypatch):
    """Another process on every core: the load average a CPU-bound neighbour gives."""
    load = trust.usable_cores() + 3.0
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))


def test_a_plan_beside_a_busy_process_is_marked_untrusted_everywhere(tmp_path, busy, caplog):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, *PLAN, "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    with caplog.at_level(logging.INFO, logger="speclab"):
        run_parts(cfg)
    plan = pd.read_parquet(output_path(cfg, "plan"))
    assert (plan.trust == "load").all() and plan.trust_detail.str.contains("timing: load").all()
    assert (pd.read_parquet(output_path(cfg, "acceptance")).trust == "load").all()
    lines = [r.getMessage() for r in caplog.records]
    rec_lines = [m for m in lines if "recommended" in m and m.startswith("[plan] code")]
    assert rec_lines and all("UNTRUSTED (load" in m for m in rec_lines), lines
    assert any("retime it alone on a quiet machine: python -m pipeline.run" in m and "force=true" in m for m in lines)
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id], "tags.stage = 'plan'")
    stage = [r for r in runs if r.data.tags["level"] == "stage"]
    assert stage and stage[0].data.tags["trust"] == "load"
    from analysis.recommend import plan_summary, show_plan

    shown = plan.assign(pair=cfg.pair.name)
    assert "UNTRUSTED (load" in show_plan(shown, top=1)
    assert set(plan_summary(shown).trust) == {"UNTRUSTED"}


def test_trust_strict_refuses_to_plan_on_an_untrusted_timing(tmp_path, busy):
    cfg = make_cfg(tmp_path, *PLAN, "trust.strict=true")
    with pytest.raises(ValueError, match=r"^trust.strict=true: the plan's timing part is untrusted \(load: load average"):
        run_parts(cfg)
    assert not output_path(cfg, "timing").exists() and not output_path(cfg, "plan").exists()


def test_trust_strict_refuses_a_plan_from_an_untrusted_timing_written_before(tmp_path, busy):
    cfg = make_cfg(tmp_path, *PLAN)
    run_parts(cfg)  # without strict: written, marked untrusted
    output_path(cfg, "plan").unlink()
    strict = make_cfg(tmp_path, *PLAN, "trust.strict=true")  # trust.strict is volatile: the same job
    with pytest.raises(ValueError, match=r"^trust.strict=true: the plan's measurements are untrusted \(timing: load"):
        run_parts(strict)
    assert not output_path(strict, "plan").exists()
