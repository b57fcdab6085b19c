"""Published campaigns are read-only to the pipeline, and a flipped byte in one of their files is one line.

Rerunning every committed job of the published campaigns (the `reference` sweep, and each file's recorded
overrides) on a copy of the committed results finds every file complete: nothing is computed, nothing
written. Files written before a stage's schema gained columns are complete for their config hash, with
those columns at their defaults. A file without a content hash in its record is checked against its
campaign's PUBLISHED checksums, so a byte flipped anywhere in it stops the pipeline and the analysis with
one line naming the file; force=true refuses to overwrite a published file unless overwrite_published=true.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

import pipeline.run
from analysis import jobs
from analysis.common import run_script
from pipeline.errors import error_line
from pipeline.jobs import config_hash, output_path
from pipeline.run import run_parts
from pipeline.stages import acceptance, speed
from pipeline_helpers import make_cfg
from store.layout import STAGES, StoreError, campaigns, stage_paths
from store.manifest import MANIFEST, is_published, read_manifest, write_manifest
from store.records import CONTENT_KEY, StageFileError, check_stage_file, open_stage_file, read_meta
from test_dvc_safety import BIN, copy_repository, run
from test_migration import as_before, earlier_conf

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ROOT / "outputs"
PUBLISHED = [c for c in campaigns(OUTPUTS) if is_published(OUTPUTS / "campaigns" / c)]
# The sweep that made `reference` (python -m pipeline.run +sweep=all campaign=reference), one job per point;
# its files were written before records held overrides.
REFERENCE_SWEEP = [["stage=all", "pair=smollm2_int8", f"prompts={kind}", f"round={r}", "campaign=reference",
                    "merge_prefill=false"]
                   for kind in ("prose", "code", "structured") for r in (0, 1)]
NO_COMPUTE = ["mlflow.enabled=false"]


def _files(outputs: Path) -> dict[str, tuple[bytes, int]]:
    """Every file git would see (job locks in ``.locks/`` are git-ignored and hold no result)."""
    return {p.relative_to(outputs).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(outputs.rglob("*")) if p.is_file() and p.relative_to(outputs).parts[0] != ".locks"}


def _recorded_jobs() -> list[tuple[list[str], dict | None, dict]]:
    """Every committed job of a published campaign that its record recomposes (as tests/test_migration.py)."""
    out = []
    for campaign in PUBLISHED:
        for path in (p for s in STAGES for p in stage_paths(OUTPUTS, campaign, s)):
            meta = read_meta(path)
            if meta.get("overrides"):
                extra, frozen, _why = earlier_conf(meta)
                kept = [o for o in meta["overrides"] if not o.startswith("force=")]  # that refuses: below
                out.append(([*kept, *extra], meta["inputs"] if "inputs" in meta else frozen, meta))
    return out


def _compose(overrides: list[str], outputs: Path, inputs: dict | None = None, meta: dict | None = None):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"outputs_dir={outputs}", *NO_COMPUTE])
    as_before(cfg, meta or {})
    if inputs is not None:
        with open_dict(cfg):
            cfg.inputs = inputs
    return cfg


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """A copy of the committed campaigns (mtimes kept) as an outputs folder."""
    out = tmp_path / "outputs"
    shutil.copytree(OUTPUTS / "campaigns", out / "campaigns", copy_function=shutil.copy2)
    return out


@pytest.fixture
def no_compute(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a job computed (loaded a model) where every file was complete")
    monkeypatch.setattr(pipeline.run, "build_context", refuse)
    monkeypatch.setattr(pipeline.run.Job, "compute", refuse)


def test_params_campaigns_are_published():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for campaign in (params["campaign"], params["time_model"]["campaign"]):
        folder = OUTPUTS / "campaigns" / campaign
        listed = {p.relative_to(folder).as_posix() for s in STAGES for p in stage_paths(OUTPUTS, campaign, s)}
        assert is_published(folder) and set(read_manifest(folder)) == listed


@pytest.mark.slow
def test_rerunning_the_published_jobs_computes_and_writes_nothing(copied, no_compute):
    before = _files(copied)
    recorded = _recorded_jobs()
    assert len(recorded) >= 20
    for overrides, inputs, meta in [(o, None, None) for o in REFERENCE_SWEEP] + recorded:
        cfg = _compose(overrides, copied, inputs, meta)
        run_parts(cfg)
        assert all(output_path(cfg, part).exists() for part in cfg.stage.parts), overrides
    assert _files(copied) == before


@pytest.mark.slow
def test_the_published_sweep_on_the_command_line_is_already_complete(copied):
    before = _files(copied)
    res = subprocess.run([sys.executable, "-m", "pipeline.run", *REFERENCE_SWEEP[4], f"outputs_dir={copied}",
                          *NO_COMPUTE, f"hydra.run.dir={copied.parent / 'hydra'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    assert said.count("already complete for this config") == 5 and "recomputing" not in said
    assert _files(copied) == before


def test_a_file_lacking_later_columns_is_complete_with_their_defaults():
    path = next(p for p in stage_paths(OUTPUTS, "reference", "acceptance")
                if "top_k" not in pq.read_schema(p).names)
    f = open_stage_file(path, acceptance.SCHEMA, read_meta(path)["config_hash"])
    assert f.table.schema.remove_metadata() == acceptance.SCHEMA
    assert set(f.data.top_k) == {0} and set(f.data.top_p) == {1.0} and f.data.prompt_len.isna().all()
    old_speed = next(p for p in stage_paths(OUTPUTS, "reference", "speed"))
    assert check_stage_file(old_speed, speed.SCHEMA) is None
    # A column the stage never had, or one of its own columns missing, is still another schema.
    assert check_stage_file(path, speed.SCHEMA) == "has columns other than the stage's schema"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _data_offset(path: Path) -> int:
    """A byte inside the data of a float column (the rows, not the footer)."""
    meta = pq.ParquetFile(path).metadata
    names = meta.schema.to_arrow_schema().names
    column = meta.row_group(0).column(names.index("wall_s"))
    return column.data_page_offset + column.total_compressed_size // 2


def test_a_flipped_bit_anywhere_in_a_published_file_is_found(copied):
    path = stage_paths(copied, "reference", "speed")[0]
    good = path.read_bytes()
    for offset in range(0, len(good), max(1, len(good) // 150)):
        _flip(path, offset)
        with pytest.raises(StageFileError) as err:
            open_stage_file(path, speed.SCHEMA, stage="speed", campaign="reference")
        assert err.value.path == path and "\n" not in str(err.value)
        path.write_bytes(good)


def test_a_flipped_byte_stops_the_pipeline_in_one_line_and_leaves_the_file(copied, no_compute):
    cfg = _compose(REFERENCE_SWEEP[4], copied)
    path = output_path(cfg, "speed")
    _flip(path, _data_offset(path))
    damaged = path.read_bytes()
    with pytest.raises(StoreError) as err:
        run_parts(cfg)
    line = error_line(err.value)
    assert "\n" not in line and str(path) in line and "published campaign 'reference'" in line
    assert "does not match its checksum" in line or "does not read" in line
    assert path.read_bytes() == damaged


def test_a_flipped_byte_stops_the_analysis_in_one_line(copied, monkeypatch, capsys):
    path = stage_paths(copied, "reference", "speed")[3]
    _flip(path, _data_offset(path))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(outputs_dir=str(copied), analysis_dir=str(copied / "analysis"))
    params["mlflow"]["enabled"] = False
    (copied.parent / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(copied.parent)
    with pytest.raises(SystemExit) as stop:
        run_script("analysis.jobs", jobs.main)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.count("\n") == 1 and err.startswith(f"analysis.jobs: error: {path} ")
    assert not (copied / "analysis").exists()


def test_a_new_file_carries_the_hash_of_its_rows(tmp_path):
    cfg = make_cfg(tmp_path, "stage=acceptance", "max_new_tokens=6", "campaign=pub")
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    assert len(read_meta(path)[CONTENT_KEY]) == 64 and check_stage_file(path, acceptance.SCHEMA) is None
    table = pq.read_table(path)
    accepted = pa.array([v + 1 for v in table.column("accepted").to_pylist()], type=pa.int32())
    pq.write_table(table.set_column(table.schema.get_field_index("accepted"), "accepted", accepted),
                   path)  # the same provenance record, other rows
    assert check_stage_file(path, acceptance.SCHEMA).startswith("holds rows whose content hash")


@pytest.mark.slow
def test_force_refuses_a_published_file_unless_overwrite_published(tmp_path, caplog):
    cfg = make_cfg(tmp_path, "stage=acceptance", "max_new_tokens=6", "campaign=pub")
    run_parts(cfg)
    path = output_path(cfg, "acceptance")
    write_manifest(tmp_path / "outputs", "pub")
    before = path.read_bytes()
    forced = make_cfg(tmp_path, "stage=acceptance", "max_new_tokens=6", "campaign=pub", "force=true")
    with pytest.raises(StoreError) as err:
        run_parts(forced)
    line = error_line(err.value)
    assert "\n" not in line and line.startswith(f"[acceptance] force=true would overwrite {path}")
    assert "overwrite_published=true" in line and path.read_bytes() == before
    allowed = make_cfg(tmp_path, "stage=acceptance", "max_new_tokens=6", "campaign=pub", "force=true",
                       "overwrite_published=true")
    assert config_hash(allowed) == config_hash(cfg)
    run_parts(allowed)
    assert path.read_bytes() != before and check_stage_file(path, acceptance.SCHEMA, config_hash(cfg)) is None
    assert MANIFEST in {p.name for p in (tmp_path / "outputs" / "campaigns" / "pub").iterdir()}


def test_manifest_command_and_a_damaged_manifest(tmp_path):
    folder = tmp_path / "outputs" / "campaigns" / "c"
    with pytest.raises(StoreError, match="has no stage files"):
        write_manifest(tmp_path / "outputs", "c")
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("not a checksum\n")
    with pytest.raises(StoreError, match=rf"{MANIFEST} line 1 is not"):
        read_manifest(folder)


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")
def test_a_flipped_byte_stops_dvc_repro_in_one_line(tmp_path):
    repo = tmp_path / "repo"
    copy_repository(repo)
    bad = stage_paths(repo / "outputs", "reference", "speed")[3]
    _flip(bad, _data_offset(bad))
    rel = bad.relative_to(repo).as_posix()
    result = run(["dvc", "repro"], repo)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    naming = [line for line in result.stderr.splitlines() if rel in line]
    assert naming == [f"analysis.jobs: error: {rel} does not match its checksum in "
                      f"outputs/campaigns/reference/{MANIFEST} (damaged or edited)"], result.stderr
    status = run(["git", "status", "--porcelain"], repo).stdout.splitlines()
    assert [line[3:] for line in status] == [rel]


def test_saved_analysis_floats_do_not_depend_on_the_last_bits(tmp_path):
    """Sums in another order differ in the last bits; the saved table, plot data and metrics do not."""
    import numpy as np
    import pandas as pd

    from analysis.common import save_json, save_table

    value = 0.1 + 0.2
    values = {"x": [value, 1 / 3, float("nan")], "n": [1, 2, 3], "name": ["a", "b", "c"]}
    nudged = {**values, "x": [np.nextafter(v, 1.0) for v in values["x"]]}
    for name, data in (("a", values), ("b", nudged)):
        save_table(pd.DataFrame(data), tmp_path / f"{name}.parquet")
        save_json({"mae": data["x"][0], "per_kind": {"code": data["x"][1]}}, tmp_path / f"{name}.json")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert pd.read_parquet(tmp_path / "a.parquet").x.iloc[0] == 0.3  # 12 significant digits
