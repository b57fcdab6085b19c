"""A multirun ended by a job's failure still prints its summary, naming the job (pipeline.jobs.sweep)."""
import json

from pipeline.jobs.summary import RECORD
from pipeline.tracking.mlflow_runs import SWEEP_DIR_ENV
from pipeline.jobs.sweep import summary_after_failure


def test_the_summary_names_the_killed_job(tmp_path, monkeypatch, capsys):
    for job, status in enumerate(["computed", "killed"]):
        folder = tmp_path / str(job)
        folder.mkdir()
        (folder / RECORD).write_text(json.dumps({"job": job, "overrides": f"k={job + 1} pair=tiny_random", "parts": [
            {"stage": "speed", "status": status, "file": "", "headline": ""}]}))
    monkeypatch.setenv(SWEEP_DIR_ENV, str(tmp_path))
    summary_after_failure()
    out = capsys.readouterr().out
    assert f"multirun of 2 jobs in {tmp_path}" in out and "| killed " in out and "k=2" in out
    assert "status: 1 computed, 1 killed" in out
    summary_after_failure()  # the folder is said once: the variable is used up
    assert capsys.readouterr().out == ""


def test_no_summary_when_no_job_got_as_far_as_its_record(tmp_path, monkeypatch, capsys):
    """Every job refused its config: the error line says it all, no "multirun of 0 jobs" table before it."""
    (tmp_path / "0").mkdir()
    monkeypatch.setenv(SWEEP_DIR_ENV, str(tmp_path))
    summary_after_failure()
    assert capsys.readouterr().out == ""
