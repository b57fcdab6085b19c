"""A published campaign cannot change: no job writes into it, and a changed byte anywhere in it is one line.

A published campaign's PUBLISHED manifest lists every file of its folder (rows, provenance records, stored
answers) by sha256, and outputs/campaigns/PUBLISHED.sha256 (the seal) holds the sha256 of each manifest.
Rerunning a committed job of a published campaign finds its files complete and writes nothing; a job that would
write (force=true, overwrite_published=true, a recorded command that now composes to a new config hash) is
refused before it computes, in one line naming the campaign, its manifest and `python -m store.extend`. A file
deleted, added or edited, or a manifest or seal deleted or edited, stops the analysis with one line naming the
file. Every test works on a temporary copy of the committed campaigns.
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

import pipeline.jobs.execute
from analysis import jobs, sealed
from analysis.common import run_script
from pipeline.config.legacy_flags import compose_recorded
from pipeline.jobs.errors import error_line
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from pipeline.stages import acceptance, speed
from pipeline_helpers import make_cfg
from store.layout import STAGES, StoreError, stage_paths
from store.manifest import (
    MANIFEST, campaign_files, campaign_problem, file_sha256, is_published, published_campaigns, read_manifest,
)
from store.records import CONTENT_KEY, StageFileError, check_stage_file, open_stage_file, read_meta
from store.seal import SEAL, read_seals
from test_dvc_safety import BIN, copy_repository, run
from test_migration import as_before, earlier_conf

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ROOT / "outputs"
PUBLISHED = published_campaigns(OUTPUTS)
# The sweep that made `reference` (python -m pipeline.run +sweep=all campaign=reference), one job per point;
# its files were written before records held overrides.
REFERENCE_SWEEP = [["stage=all", "pair=smollm2_int8", f"prompts={kind}", f"round={r}", "campaign=reference",
                    "merge_prefill=false"]
                   for kind in ("prose", "code", "structured") for r in (0, 1)]
NO_COMPUTE = ["mlflow.enabled=false"]
EXTEND = "python -m store.extend"


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
        cfg = compose_recorded([*overrides, f"outputs_dir={outputs}", *NO_COMPUTE],  # flags before stage.arms: arms
                               lambda o: compose(config_name="config", overrides=o))
    as_before(cfg, meta or {})
    if inputs is not None:
        with open_dict(cfg):
            cfg.inputs = inputs
    return cfg


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """A copy of the committed campaigns and their seal (mtimes kept) as an outputs folder."""
    out = tmp_path / "outputs"
    shutil.copytree(OUTPUTS / "campaigns", out / "campaigns", copy_function=shutil.copy2)
    return out


@pytest.fixture
def no_compute(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a job computed (loaded a model) where it should have been refused or complete")
    monkeypatch.setattr(pipeline.jobs.execute, "build_context", refuse)
    monkeypatch.setattr(pipeline.jobs.execute.Job, "compute", refuse)


@pytest.fixture
def workdir(copied: Path, monkeypatch) -> Path:
    """A working directory whose params.yaml reads the copied campaigns, MLflow off."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(outputs_dir=str(copied), analysis_dir=str(copied / "analysis"))
    params["mlflow"]["enabled"] = False
    (copied.parent / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(copied.parent)
    return copied.parent


# --- the committed campaigns ---------------------------------------------------------------------------------


def test_every_published_campaign_lists_every_file_and_is_sealed():
    assert {"reference", "timemodel2", "qwen25", "specbench", "trees", "treeplan", "timemodel"} <= set(PUBLISHED)
    assert set(read_seals(OUTPUTS / "campaigns")) == set(PUBLISHED)
    for campaign in PUBLISHED:
        folder = OUTPUTS / "campaigns" / campaign
        assert set(read_manifest(folder)) == set(campaign_files(folder)), campaign
        assert campaign_problem(folder) is None, campaign
    assert "answers/0666e439095c6503.json" in read_manifest(OUTPUTS / "campaigns" / "specbench")


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum")
def test_sha256sum_reads_the_manifests_and_the_seal():
    for folder in [OUTPUTS / "campaigns", *(OUTPUTS / "campaigns" / c for c in PUBLISHED)]:
        name = SEAL if folder.name == "campaigns" else MANIFEST
        res = subprocess.run(["sha256sum", "--strict", "-c", name], cwd=folder, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_params_campaigns_are_published():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for campaign in (params["campaign"], params["time_model"]["campaign"], params["pair_campaign"],
                     params["spec_bench_campaign"], params["trees_campaign"], params["plan_campaign"]):
        assert is_published(OUTPUTS / "campaigns" / campaign), campaign


def test_dvc_stages_depend_on_the_manifests_and_the_seal():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    seal = f"outputs/campaigns/{SEAL}"
    assert set(stages["sealed"]["deps"]) >= {seal, *(f"outputs/campaigns/{c}" for c in PUBLISHED)}
    assert {d for d in stages["sealed"]["deps"] if d.startswith("outputs/campaigns/") and d != seal} == \
        {f"outputs/campaigns/{c}" for c in PUBLISHED}, "run `python -m store.manifest NAME`: it says what to add"
    readers = {name: [d for d in stage["deps"] if d.startswith("outputs/campaigns/${")]
               for name, stage in stages.items()}
    assert {n for n, d in readers.items() if d} >= {"jobs", "fit", "time_model", "pair_section", "trees", "answer"}
    for name, folders in readers.items():
        # the whole folder (its manifest included), never a stage folder of it, and the seal beside
        assert all(d.count("/") == 2 for d in folders), (name, folders)
        assert not folders or seal in stages[name]["deps"], name


# --- jobs into a published campaign ----------------------------------------------------------------------


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
def test_every_recorded_command_as_is_or_forced_writes_nothing(copied, no_compute):
    """Each committed job's own overrides, with today's defaults (no earlier settings restored) or force=true:
    complete, or refused in one line; nothing computed, nothing written."""
    before = _files(copied)
    refused = 0
    for _overrides, _inputs, meta in _recorded_jobs():
        recorded = [o for o in meta["overrides"] if not o.startswith("force=")]
        for overrides in (recorded, [*recorded, "force=true"]):
            try:
                run_parts(_compose(overrides, copied))
            except StoreError as err:
                line = error_line(err)
                assert "\n" not in line and "is published" in line and EXTEND in line, line
                refused += 1
    assert refused >= len(_recorded_jobs())  # every forced one at least
    assert _files(copied) == before


@pytest.mark.parametrize("flag", ["force=true", "overwrite_published=true"])
def test_force_and_overwrite_published_are_refused_before_anything_runs(copied, no_compute, flag):
    before = _files(copied)
    cfg = _compose([*REFERENCE_SWEEP[4], flag], copied)
    with pytest.raises(StoreError) as err:
        run_parts(cfg)
    line = error_line(err.value)
    manifest = copied / "campaigns" / "reference" / MANIFEST
    assert "\n" not in line
    assert line.startswith(f"{flag} is not allowed: campaign 'reference' is published ({manifest})")
    assert f"{EXTEND} reference -- OVERRIDES" in line
    assert _files(copied) == before


# The issue's commands that wrote into `reference` (without the multirun: one job each) and a new job in
# `specbench`: each composes to a config hash the campaign does not hold.
NEW_HASH = [["stage=acceptance", "prompts=structured", "round=0", "campaign=reference"],
            ["stage=batch", "round=0", "campaign=reference"],
            ["stage=all", "prompts=structured", "round=0", "campaign=reference"],
            ["stage=acceptance", "prompts=code", "max_new_tokens=9", "campaign=specbench"]]


@pytest.mark.parametrize("overrides", NEW_HASH, ids=lambda o: " ".join(o))
def test_a_job_that_would_add_a_file_is_refused_before_it_computes(copied, no_compute, overrides):
    before = _files(copied)
    cfg = _compose(overrides, copied)
    with pytest.raises(StoreError) as err:
        run_parts(cfg)
    line = error_line(err.value)
    campaign = cfg.campaign
    manifest = copied / "campaigns" / campaign / MANIFEST
    assert "\n" not in line and f"campaign {campaign!r} is published ({manifest})" in line
    assert "would add " in line and f"{EXTEND} {campaign} -- OVERRIDES" in line
    assert _files(copied) == before


@pytest.mark.parametrize("damage", ["delete", "empty"])
def test_a_campaign_whose_manifest_is_gone_still_refuses_jobs(copied, no_compute, damage):
    manifest = copied / "campaigns" / "reference" / MANIFEST
    manifest.unlink() if damage == "delete" else manifest.write_text("")
    before = _files(copied)
    with pytest.raises(StoreError) as err:
        run_parts(_compose(NEW_HASH[0], copied))
    line = error_line(err.value)
    assert "\n" not in line and f"campaign 'reference' is published ({manifest}) but has changed: {manifest} " in line
    assert _files(copied) == before


def test_a_stale_extension_variable_opens_nothing(copied, no_compute, monkeypatch):
    monkeypatch.setenv("SPECLAB_EXTEND", "0123456789abcdef")
    with pytest.raises(StoreError, match="is published"):
        run_parts(_compose(NEW_HASH[0], copied))


@pytest.mark.slow
def test_the_published_sweep_on_the_command_line_is_already_complete(copied):
    before = _files(copied)
    res = _pipeline_cli([*REFERENCE_SWEEP[4], f"outputs_dir={copied}", *NO_COMPUTE,
                         f"hydra.run.dir={copied.parent / 'hydra'}"])
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    assert said.count("already complete for this config") == 5 and "recomputing" not in said
    assert _files(copied) == before


def _pipeline_cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


# The issue's commands as typed (with a temporary outputs folder), multiruns included.
ISSUE_COMMANDS = [["+sweep=batch", "round=0", "campaign=reference", "force=true"],
                  ["+sweep=all", "prompts=structured", "round=0", "campaign=reference"],
                  ["stage=acceptance", "prompts=structured", "round=0", "campaign=reference"]]


@pytest.mark.slow
@pytest.mark.parametrize("command", ISSUE_COMMANDS, ids=lambda c: " ".join(c))
def test_the_issue_commands_are_refused_in_one_line(copied, command):
    before = _files(copied)
    res = _pipeline_cli([*command, f"outputs_dir={copied}", *NO_COMPUTE,
                         f"hydra.run.dir={copied.parent / 'hydra'}", f"hydra.sweep.dir={copied.parent / 'sweep'}"])
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert len(errors) == 1 and errors[0].startswith("speclab: error: "), res.stderr
    assert "campaign 'reference' is published" in errors[0] and f"{EXTEND} reference -- " in errors[0]
    assert _files(copied) == before


# --- a changed byte ------------------------------------------------------------------------------------------


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
    assert "\n" not in line and "campaign 'reference' is published" in line
    assert f"{path} does not match its checksum in {path.parents[1] / MANIFEST}" in line
    assert path.read_bytes() == damaged


def _provenance_offset(path: Path) -> int:
    """A digit of the year the provenance record's job finished (the record, not the rows)."""
    data = path.read_bytes()
    return data.index(b'"finished_at": "') + len(b'"finished_at": "') + 3


def _refiled(copied: Path) -> Path:
    """A copy of a committed speed file under a config hash the campaign does not hold."""
    src = stage_paths(copied, "reference", "speed")[0]
    return src.with_name(f"smollm2_int8-{'0' * 16}.parquet")


def _tamper(copied: Path, how: str) -> Path:
    """Change the copied campaigns one way; the file the refusal must name."""
    camp = copied / "campaigns"
    content_hashed = next(p for p in stage_paths(copied, "qwen25", "acceptance") if CONTENT_KEY in read_meta(p))
    if how == "rows":
        path = stage_paths(copied, "reference", "speed")[3]
        _flip(path, _data_offset(path))
    elif how == "provenance":
        path = content_hashed
        _flip(path, _provenance_offset(path))
    elif how == "answer":
        path = camp / "specbench" / "answers" / "0666e439095c6503.json"
        path.write_text(path.read_text() + " ")  # the same answer to a JSON reader
    elif how == "deleted":
        path = stage_paths(copied, "reference", "timing")[0]
        path.unlink()
    elif how == "added stage file":
        path = _refiled(copied)
        shutil.copy(stage_paths(copied, "reference", "speed")[0], path)
    elif how == "added other file":
        path = camp / "treeplan" / "notes.txt"
        path.write_text("a note\n")
    elif how == "manifest deleted":
        path = camp / "reference" / MANIFEST
        path.unlink()
    elif how == "manifest emptied":
        path = camp / "reference" / MANIFEST
        path.write_text("")
    elif how == "manifest follows an edit":
        edited = stage_paths(copied, "reference", "speed")[3]
        _flip(edited, _data_offset(edited))
        path = camp / "reference" / MANIFEST
        name = f"speed/{edited.name}"
        path.write_text("".join(f"{file_sha256(edited) if n == name else d}  {n}\n"
                                for n, d in read_manifest(path.parent).items()))
    elif how == "seal deleted":
        path = camp / SEAL
        path.unlink()
    elif how == "seal edited":
        path = camp / SEAL
        text = path.read_text()
        path.write_text(("0" if text[0] != "0" else "1") + text[1:])
    else:
        raise ValueError(how)
    return path


TAMPERING = ["rows", "provenance", "answer", "deleted", "added stage file", "added other file", "manifest deleted",
             "manifest emptied", "manifest follows an edit", "seal deleted", "seal edited"]


@pytest.mark.parametrize("how", TAMPERING)
def test_a_changed_published_campaign_stops_the_analysis_in_one_line(workdir, copied, capsys, how):
    named = _tamper(copied, how)
    with pytest.raises(SystemExit) as stop:
        run_script("analysis.jobs", jobs.main)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"analysis.jobs: error: {named} ") or f" {named} " in err, err
    assert not (copied / "analysis").exists()


@pytest.mark.parametrize("how", ["provenance", "added other file", "deleted"])
def test_the_sealed_stage_stops_on_a_campaign_no_other_stage_reads(workdir, copied, capsys, how):
    named = _tamper(copied, how)
    with pytest.raises(SystemExit):
        run_script("analysis.sealed", sealed.main)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"analysis.sealed: error: {named} ")


def test_the_sealed_stage_says_each_campaign_is_as_published(workdir, capsys):
    run_script("analysis.sealed", sealed.main)
    assert capsys.readouterr().out == f"{len(PUBLISHED)} published campaigns, each as published: " \
                                      f"{', '.join(PUBLISHED)}\n"


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
    assert len(naming) == 1 and naming[0].endswith(f": error: {rel} does not match its checksum in "
                                                   f"outputs/campaigns/reference/{MANIFEST} (damaged or edited)"), \
        result.stderr
    status = run(["git", "status", "--porcelain"], repo).stdout.splitlines()
    assert [line[3:] for line in status] == [rel]


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")
@pytest.mark.parametrize("how", ["added other file", "manifest deleted", "seal edited"])
def test_a_changed_published_campaign_stops_dvc_repro_in_one_line(tmp_path, how):
    repo = tmp_path / "repo"
    copy_repository(repo)
    rel = _tamper(repo / "outputs", how).relative_to(repo).as_posix()
    result = run(["dvc", "repro"], repo)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("analysis.")]
    # (an edited seal: the line names the manifest that no longer matches it, then the seal)
    assert len(ours) == 1 and f" {rel} " in ours[0], result.stderr
    status = run(["git", "status", "--porcelain", "--untracked-files=all"], repo).stdout.splitlines()
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
