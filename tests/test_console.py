"""What the console says around jobs: a sweep's progress line with the time left (pipeline/jobs/progress.py) and a
``--help`` of what a user picks (pipeline/run.py). Ctrl-C in a multirun: tests/test_runs_end.py."""
import json
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.jobs.progress import STATE, SweepProgress, progress_line, sweep_size
from pipeline.run import user_help
from pipeline.jobs.summary import RECORD

ROOT = Path(__file__).resolve().parents[1]


def test_the_sweep_size_is_hydras_product_with_later_values_replacing_earlier():
    assert sweep_size({"pair": "a,b", "k": "1,2,3"}, []) == 6
    assert sweep_size({"pair": "a,b", "k": "1,2,3"}, ["k=4", "prompts=code,prose,structured"]) == 6
    assert sweep_size({}, ["stage=speed"]) == 1


def test_the_time_left_is_the_mean_finished_job_times_the_jobs_to_run():
    assert progress_line(3, 12, 2, 240) == "sweep: job 3 of 12 (2 finished, 4.0 min so far, about 20.0 min left)"
    assert progress_line(1, 4, 0, 1).endswith("time left known after the first job)")
    assert progress_line(2, 0, 1, 60) == "sweep: job 2 (1 finished, 1.0 min so far)"


def test_each_job_of_a_multirun_prints_its_place_and_the_time_left(tmp_path, capsys):
    cfg = OmegaConf.create({"hydra": {"mode": "MULTIRUN", "sweep": {"dir": str(tmp_path)}, "job": {"num": 2},
                                      "sweeper": {"params": {"k": "1,2,4"}},
                                      "overrides": {"task": ["prompts=code,prose"]}}})
    callback = SweepProgress()
    callback.on_multirun_start(cfg)
    state = json.loads((tmp_path / STATE).read_text())
    assert state["total"] == 6
    for job in ("0", "1"):
        (tmp_path / job).mkdir()
        (tmp_path / job / RECORD).write_text("{}")
    state["started"] -= 120  # two jobs took two minutes
    (tmp_path / STATE).write_text(json.dumps(state))
    callback.on_job_start(cfg)
    out = capsys.readouterr().out.strip()
    assert out.startswith("sweep: job 3 of 6 (2 finished, 2.0 min so far, about 4.0 min left")
    callback.on_job_start(OmegaConf.create({"hydra": {"mode": "RUN", "sweep": {"dir": str(tmp_path)}}}))
    assert capsys.readouterr().out == ""  # a single job has no sweep to place it in


def test_help_lists_what_a_user_picks_not_the_schemas_groups():
    assert user_help("pair: a, b\nschema/stage: speed\nstage: quick\n") == "pair: a, b\nstage: quick\n"
    res = subprocess.run([sys.executable, "-m", "pipeline.run", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    groups = res.stdout.split("== Config groups")[1].split("== Config (")[0]
    assert "schema/" not in groups and "\npair: " in groups and "\nsweep: " in groups


QUIET = """
import sys, threading
{install}
class Finalized:
    def __del__(self):
        raise KeyboardInterrupt
Finalized()
def interrupted():
    raise KeyboardInterrupt
t = threading.Thread(target=interrupted); t.start(); t.join()
print("went on")
"""


def test_a_ctrl_c_landing_in_a_finalizer_or_a_thread_prints_no_traceback():
    def run(install: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", QUIET.format(install=install)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    loud = run("")
    assert "Traceback" in loud.stderr and "KeyboardInterrupt" in loud.stderr  # what Python does on its own
    quiet = run("from pipeline.jobs.errors import quiet_interrupts; quiet_interrupts()")
    assert quiet.stderr == "" and quiet.stdout == "went on\n"


def test_a_long_run_description_fits_mlflows_limit_in_whole_lines():
    from pipeline.tracking.mlflow_runs import NOTE_LIMIT, note_text

    short = ["a", "b"]
    assert note_text(short) == "a\nb"
    lines = [f"line {i}: " + "x" * 90 for i in range(200)]  # about 20,000 characters
    text = note_text(lines)
    assert len(text) <= NOTE_LIMIT and text.splitlines()[:-1] == lines[:len(text.splitlines()) - 1]
    assert text.splitlines()[-1].startswith(f"... {200 - (len(text.splitlines()) - 1)} more lines")
