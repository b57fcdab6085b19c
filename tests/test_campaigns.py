"""The analysis pools only the published campaign, and a bad input stops it with one line, before any write."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from analysis import drift, jobs
from analysis.common import read_stage, read_stage_if_any, run_script
from analysis.inputs import AnalysisError
from analysis.jobs import job_table
from store.manifest import publish
from store.records import read_meta, write_parquet

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "outputs" / "campaigns" / "reference"
# A few committed results: two speed jobs and one timing job are enough to tell campaigns apart.
SPEED = sorted((REFERENCE / "speed").glob("*.parquet"))[:2]
TIMING = sorted((REFERENCE / "timing").glob("*.parquet"))[:1]


def refile(src: Path, outputs: Path, campaign: str, stage: str, config_hash: str | None = None) -> Path:
    """Store a committed result under ``campaign`` (as job ``config_hash`` when given), its record saying so."""
    meta, df = {**read_meta(src), "campaign": campaign}, pd.read_parquet(src)
    if config_hash:
        meta["config_hash"] = config_hash
        df["config_hash"] = config_hash
    dst = outputs / "campaigns" / campaign / stage / f"{meta['pair']}-{meta['config_hash']}.parquet"
    write_parquet(df, pq.read_schema(src).remove_metadata(), dst, meta)
    return dst


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """reference: 2 speed + 1 timing job; scratch: the same speed jobs rerun, and one more."""
    out = tmp_path / "outputs"
    for src in SPEED:
        refile(src, out, "reference", "speed")
        refile(src, out, "scratch", "speed")
    for src in TIMING:
        refile(src, out, "reference", "timing")
    refile(SPEED[0], out, "scratch", "speed", config_hash="00000000feedbeef")
    return out


@pytest.fixture
def workdir(outputs: Path, monkeypatch) -> Path:
    """A working directory whose params.yaml publishes campaign `reference` from ``outputs``."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(campaign="reference", outputs_dir=str(outputs), analysis_dir=str(outputs / "analysis"),
                  figures_dir=str(outputs / "figures"))
    params["mlflow"]["enabled"] = False
    (outputs.parent / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(outputs.parent)
    return outputs.parent


def test_read_stage_sees_only_the_named_campaign(outputs):
    ref = read_stage(outputs, "speed", "reference")
    expected = sum(read_meta(p)["rows"] for p in SPEED)
    assert len(ref) == expected and set(ref.campaign) == {"reference"}
    assert "00000000feedbeef" not in set(ref.config_hash)
    scratch = read_stage(outputs, "speed", "scratch")
    assert set(scratch.campaign) == {"scratch"} and "00000000feedbeef" in set(scratch.config_hash)
    assert read_stage(outputs, "acceptance", "reference").empty  # a stage the campaign has no results for


def test_job_table_lists_the_campaign_files_with_their_provenance(outputs):
    table = job_table(outputs, "reference")
    assert list(table.stage) == ["timing", "speed", "speed"]  # stage order, then file name
    assert set(table.campaign) == {"reference"}
    assert set(table.config_hash) == {read_meta(p)["config_hash"] for p in SPEED + TIMING}
    assert list(table.rows) == [read_meta(p)["rows"] for p in TIMING + SPEED]
    assert table.finished_at.notna().all() and table.git_commit.notna().all()


def test_jobs_script_ignores_other_campaigns(workdir, outputs):
    jobs.main()
    written = pd.read_parquet(outputs / "analysis" / "jobs.parquet")
    assert set(written.campaign) == {"reference"} and len(written) == 3


def corrupt_truncated(path: Path) -> str:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "is not a readable Parquet file"


def corrupt_foreign(path: Path) -> str:
    pd.DataFrame({"a": [1, 2]}).to_parquet(path)
    return "carries no speclab provenance record"


def corrupt_other_stage(path: Path) -> str:
    shutil.copy(path.parents[1] / "timing" / TIMING[0].name, path)
    return "was written by stage 'timing', not 'speed'"


def corrupt_other_campaign(path: Path) -> str:
    shutil.copy(path.parents[2] / "scratch" / "speed" / path.name, path)  # a scratch run copied in by hand
    return "belongs to campaign 'scratch', not 'reference'"


@pytest.mark.parametrize("corrupt", [corrupt_truncated, corrupt_foreign, corrupt_other_stage,
                                     corrupt_other_campaign])
def test_bad_input_is_one_line_and_nothing_is_written(workdir, outputs, capsys, corrupt):
    bad = outputs / "campaigns" / "reference" / "speed" / SPEED[1].name
    reason = corrupt(bad)
    committed = outputs / "analysis" / "drift.parquet"
    committed.parent.mkdir(parents=True)
    committed.write_bytes(b"committed result")
    with pytest.raises(SystemExit) as stop:
        run_script("analysis.drift", drift.main)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"analysis.drift: error: {bad} {reason}")
    assert committed.read_bytes() == b"committed result"
    assert not (outputs / "figures").exists()


def test_campaign_without_results_is_one_line(workdir, outputs, capsys):
    params = yaml.safe_load(Path("params.yaml").read_text())
    Path("params.yaml").write_text(yaml.safe_dump({**params, "campaign": "nothing-here"}))
    with pytest.raises(SystemExit):
        run_script("analysis.jobs", jobs.main)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("analysis.jobs: error: campaign 'nothing-here' has no results")
    assert not (outputs / "analysis").exists()


@pytest.mark.parametrize("name", ["", "../reference", "a/b", None])
def test_campaign_must_be_a_folder_name(outputs, name):
    with pytest.raises(AnalysisError, match="is not a campaign name"):
        read_stage(outputs, "speed", name)


@pytest.mark.parametrize("read", [read_stage, read_stage_if_any])
def test_a_published_campaign_that_lost_a_file_is_read_by_no_path(outputs, read):
    """Even a stage the campaign holds no file of: the campaign as a whole is as published, or unread."""
    publish(outputs, "reference")
    gone = outputs / "campaigns" / "reference" / "timing" / TIMING[0].name
    gone.unlink()
    for stage in ("speed", "batch"):
        with pytest.raises(AnalysisError) as err:
            read(outputs, stage, "reference")
        assert str(err.value) == f"{gone} is missing: {outputs / 'campaigns' / 'reference' / 'PUBLISHED'} lists it"
    assert not read_stage(outputs, "speed", "scratch").empty  # an unpublished campaign reads as before
