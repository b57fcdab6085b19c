"""Publishing a campaign and extending a published one on purpose (store.manifest, store.extend).

`python -m store.manifest NAME` lists every file of the campaign in its PUBLISHED manifest and seals the
manifest in outputs/campaigns/PUBLISHED.sha256; `python -m store.extend NAME -- OVERRIDES` runs the pipeline's
jobs into it with a one-time permit, then lists the files they added, reseals and says so. The fast tests
stand a stub in for the pipeline's process; the slow one runs a tiny job through the real command.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import store.extend
from store.extend import PERMIT_ENV, extend, extension_permitted
from store.layout import StoreError, stage_paths
from store.locks import extension_paths
from store.manifest import (
    MANIFEST, campaign_problem, file_sha256, main as manifest_main, publish, read_manifest, write_manifest,
)
from store.seal import SEAL, read_seals
from test_campaigns import SPEED, TIMING, refile

ROOT = Path(__file__).resolve().parents[1]
ANSWER = ROOT / "outputs" / "campaigns" / "specbench" / "answers" / "0666e439095c6503.json"


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """Campaign `c`: two committed speed jobs, one timing job and a stored answer, filed under `c`; unpublished."""
    out = tmp_path / "outputs"
    for src in SPEED:
        refile(src, out, "c", "speed")
    refile(TIMING[0], out, "c", "timing")
    (out / "campaigns" / "c" / "answers").mkdir()
    shutil.copy(ANSWER, out / "campaigns" / "c" / "answers" / ANSWER.name)
    return out


@pytest.fixture
def published(outputs: Path) -> Path:
    publish(outputs, "c")
    return outputs


def _folder(outputs: Path) -> Path:
    return outputs / "campaigns" / "c"


def test_publishing_lists_every_file_and_seals_the_manifest(outputs, capsys):
    manifest_main(["c", "--outputs-dir", str(outputs)])
    said = capsys.readouterr().out
    folder = _folder(outputs)
    assert said.startswith(f"published campaign 'c': {folder / MANIFEST} lists its 4 files")
    assert "python -m store.extend c -- OVERRIDES" in said and "dvc.yaml" in said
    lines = (folder / MANIFEST).read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == sorted(["speed/" + p.name for p in SPEED]
                                                             + ["timing/" + TIMING[0].name, "answers/" + ANSWER.name])
    assert all(line.split("  ")[0] == file_sha256(folder / line.split("  ")[1]) for line in lines)
    assert read_seals(outputs / "campaigns") == {"c": file_sha256(folder / MANIFEST)}
    assert (outputs / "campaigns" / SEAL).read_text() == f"{file_sha256(folder / MANIFEST)}  c/{MANIFEST}\n"
    assert campaign_problem(folder) is None
    manifest_main(["c", "--outputs-dir", str(outputs)])  # again: nothing to do
    assert capsys.readouterr().out == f"campaign 'c' is published and intact (4 files in {folder / MANIFEST})\n"


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum")
def test_sha256sum_checks_a_published_campaign(published):
    for folder, name in ((_folder(published), MANIFEST), (published / "campaigns", SEAL)):
        assert subprocess.run(["sha256sum", "--strict", "--quiet", "-c", name], cwd=folder).returncode == 0


def test_publishing_again_refuses_a_changed_campaign(published, capsys):
    (_folder(published) / "speed" / SPEED[0].name).write_bytes(b"edited")
    with pytest.raises(SystemExit):
        manifest_main(["c", "--outputs-dir", str(published)])
    err = capsys.readouterr().err
    assert err == (f"store.manifest: error: {_folder(published) / 'speed' / SPEED[0].name} does not match its "
                   f"checksum in {_folder(published) / MANIFEST} (damaged or edited)\n")


def test_a_manifest_from_before_seals_is_sealed_with_every_file(outputs, capsys):
    folder = _folder(outputs)
    (folder / MANIFEST).write_text("".join(f"{file_sha256(p)}  {p.parent.name}/{p.name}\n"
                                           for s in ("timing", "speed") for p in stage_paths(outputs, "c", s)))
    assert campaign_problem(folder).startswith(f"{folder / MANIFEST} has no line in {outputs / 'campaigns' / SEAL}")
    manifest_main(["c", "--outputs-dir", str(outputs)])
    said = capsys.readouterr().out
    assert said.startswith("sealed campaign 'c', published before seals") and f"answers/{ANSWER.name}" in said
    assert set(read_manifest(folder)) == {f"answers/{ANSWER.name}", *(f"speed/{p.name}" for p in SPEED),
                                          f"timing/{TIMING[0].name}"}
    assert campaign_problem(folder) is None


def test_a_manifest_from_before_seals_with_a_changed_file_is_not_sealed(outputs):
    folder = _folder(outputs)
    (folder / MANIFEST).write_text(f"{'0' * 64}  timing/{TIMING[0].name}\n")
    with pytest.raises(StoreError, match="does not match its checksum"):
        publish(outputs, "c")
    assert "c" not in read_seals(outputs / "campaigns")


def test_check_names_the_first_changed_file(published, capsys):
    manifest_main(["--check", "--outputs-dir", str(published)])
    assert capsys.readouterr().out == "1 published campaigns as published: c\n"
    (_folder(published) / "answers" / ANSWER.name).unlink()
    with pytest.raises(SystemExit):
        manifest_main(["--check", "--outputs-dir", str(published)])
    assert capsys.readouterr().err == (f"store.manifest: error: {_folder(published) / 'answers' / ANSWER.name} is "
                                       f"missing: {_folder(published) / MANIFEST} lists it\n")


def test_nothing_to_publish(tmp_path):
    (tmp_path / "outputs" / "campaigns" / "c").mkdir(parents=True)
    with pytest.raises(StoreError, match="has no stage files"):
        write_manifest(tmp_path / "outputs", "c")


# --- store.extend ----------------------------------------------------------------------------------------


@pytest.fixture
def stub_pipeline(published, monkeypatch):
    """The pipeline's process, stood in for: it checks its permit, then files the jobs given as overrides
    ``add=<src stage file>`` / ``junk=<name>`` into campaign c; ``exit=<status>`` is its exit status."""
    calls = []

    def run(command, env):
        assert command[:3] == [sys.executable, "-m", "pipeline.run"] and "campaign=c" in command
        assert f"outputs_dir={published.resolve()}" in command
        with monkeypatch.context() as m:
            m.setenv(PERMIT_ENV, env[PERMIT_ENV])
            assert extension_permitted(published, "c") and not extension_permitted(published, "other")
        status = 0
        for override in command[3:]:
            key, _, value = override.partition("=")
            if key == "add":
                refile(Path(value), published, "c", Path(value).parent.name, config_hash="00000000feedbeef")
            elif key == "junk":
                (_folder(published) / value).write_text("junk")
            elif key == "exit":
                status = int(value)
        calls.append(command)
        return subprocess.CompletedProcess(command, status)

    monkeypatch.setattr(store.extend.subprocess, "run", run)
    return calls


def test_extend_runs_the_jobs_then_lists_and_seals_what_they_added(published, stub_pipeline, capsys):
    folder = _folder(published)
    before = read_manifest(folder)
    seal_before = (published / "campaigns" / SEAL).read_text()
    assert extend(published, "c", [f"add={SPEED[0]}"]) == 0
    added = f"speed/{SPEED[0].name.rsplit('-', 1)[0]}-00000000feedbeef.parquet"
    out = capsys.readouterr().out.splitlines()
    assert out == [f"store.extend: extended published campaign 'c': {folder / MANIFEST} rewritten, 5 files listed, "
                   "1 added:", f"  {folder / added}",
                   f"store.extend: {published / 'campaigns' / SEAL} holds the new manifest's sha256; commit both "
                   "with the files added"]
    assert read_manifest(folder) == {**before, added: file_sha256(folder / added)}
    assert (published / "campaigns" / SEAL).read_text() != seal_before and campaign_problem(folder) is None
    assert not extension_paths(published, "c")[1].exists()  # the permit ends with the command
    assert len(stub_pipeline) == 1


def test_extend_with_nothing_added_leaves_the_manifest(published, stub_pipeline, capsys):
    manifest = (_folder(published) / MANIFEST).read_bytes()
    assert extend(published, "c", []) == 0
    assert capsys.readouterr().out == (f"store.extend: nothing added to published campaign 'c': "
                                       f"{_folder(published) / MANIFEST} is unchanged\n")
    assert (_folder(published) / MANIFEST).read_bytes() == manifest and len(stub_pipeline) == 1


def test_a_failed_extension_lists_nothing_and_the_rerun_finishes_it(published, stub_pipeline, capsys):
    manifest = (_folder(published) / MANIFEST).read_bytes()
    assert extend(published, "c", [f"add={SPEED[0]}", "exit=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"store.extend: error: the pipeline exited with 2: {_folder(published) / MANIFEST} is "
                          "unchanged; 1 files added are not listed yet") and err.count("\n") == 1
    assert (_folder(published) / MANIFEST).read_bytes() == manifest
    assert campaign_problem(_folder(published)).endswith("adds jobs on purpose)")  # the analysis refuses it
    assert extend(published, "c", None) == 0  # without --: list what was added
    assert len(stub_pipeline) == 1 and campaign_problem(_folder(published)) is None


def test_extend_lists_only_stage_files_and_stored_answers(published, stub_pipeline):
    with pytest.raises(StoreError, match=r"notes\.txt cannot be listed: it is neither a stage file nor a stored"):
        extend(published, "c", ["junk=notes.txt"])
    assert "notes.txt" not in read_manifest(_folder(published))


@pytest.mark.parametrize("override", ["force=true", "overwrite_published=true", "campaign=other",
                                      "outputs_dir=/tmp/x", "+force=true"])
def test_extend_refuses_overrides_that_would_replace_or_move(published, stub_pipeline, override):
    with pytest.raises(StoreError, match=re.escape(f"'{override}' is not allowed after --")):
        extend(published, "c", ["stage=acceptance", override])
    assert not stub_pipeline


def test_extend_refuses_a_campaign_that_is_not_published_or_has_changed(published, stub_pipeline):
    refile(TIMING[0], published, "u", "timing")
    with pytest.raises(StoreError, match="campaign 'u' is not published"):
        extend(published, "u", [])
    (_folder(published) / "timing" / TIMING[0].name).unlink()
    with pytest.raises(StoreError, match="is missing"):
        extend(published, "c", [])
    assert not stub_pipeline


@pytest.mark.slow
def test_the_extend_command_adds_a_job_and_the_pipeline_refuses_it_without(published, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    job = ["stage=acceptance", "pair=tiny_random", "prompts=smoke", "max_new_tokens=6", "device=cpu",
           "mlflow.enabled=false"]
    hydra = [f"hydra.run.dir={tmp_path / 'hydra'}"]

    def pipeline(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline.run", *job, *hydra, *extra, "campaign=c",
                               f"outputs_dir={published}"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)

    refused = pipeline()
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"speclab: error: [acceptance] campaign 'c' is published "
                                     f"({_folder(published) / MANIFEST}): no job writes into it")
    assert f"python -m store.extend c -- {' '.join(job)}" in refused.stderr

    command = ["-m", "store.extend", "c", "--outputs-dir", str(published), "--", *job, *hydra]
    res = subprocess.run([sys.executable, *command],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    added = stage_paths(published, "c", "acceptance")
    assert len(added) == 1 and "extended published campaign 'c'" in res.stdout and f"  {added[0]}" in res.stdout
    assert f"acceptance/{added[0].name}" in read_manifest(_folder(published))
    assert campaign_problem(_folder(published)) is None

    again = pipeline()  # the same job now: complete, nothing written
    assert again.returncode == 0 and "already complete for this config" in again.stdout + again.stderr
    assert campaign_problem(_folder(published)) is None
