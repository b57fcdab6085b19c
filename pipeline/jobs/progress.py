"""A sweep's progress line: as each job of a multirun starts, which job of how many, how long the sweep has run
and about how long it has left (the mean time of the jobs finished so far, times the jobs still to run).

The state is the sweep folder's: a small file written as the multirun starts (the number of jobs, the start time)
and the job records the finished jobs leave there (pipeline/jobs/summary.py), so the line is right in the multirun's own
process, in a joblib worker and on a SLURM node alike."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

STATE = ".speclab_sweep.json"


def sweep_size(params: dict[str, str], overrides: list[str]) -> int:
    """How many jobs Hydra's basic sweeper makes of the preset's params and the command line's overrides: its own
    split of them (a later value of a key replaces an earlier one; each comma list multiplies)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *overrides])
    return len(BasicSweeper.split_arguments(parsed, None)[0])


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def progress_line(job: int, total: int, finished: int, elapsed_s: float) -> str:
    """``sweep: job 3 of 12 (2 finished, 4.1 min so far, about 20.5 min left)``; no estimate before a job ends or
    where the sweep's size is unknown (``total`` 0)."""
    if not total:
        return f"sweep: job {job} ({finished} finished, {minutes(elapsed_s)} so far)"
    left = (f"about {minutes(elapsed_s / finished * max(0, total - finished))} left" if finished
            else "time left known after the first job")
    return f"sweep: job {job} of {total} ({finished} finished, {minutes(elapsed_s)} so far, {left})"


def finished_jobs(sweep_dir: Path) -> int:
    from pipeline.jobs.summary import RECORD

    return len(list(sweep_dir.glob(f"*/{RECORD}")))


class SweepProgress(Callback):
    """Hydra callback (conf/config.yaml): writes the sweep's size as it starts, prints the line as a job starts."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hc = config.hydra
        params = OmegaConf.to_container(hc.sweeper.params) if hc.sweeper.get("params") else {}
        try:
            total = sweep_size({k: str(v) for k, v in (params or {}).items()}, list(hc.overrides.task))
        except Exception:  # noqa: BLE001 - a sweeper this count does not model: the line says "of ?"
            total = 0
        folder = Path(str(hc.sweep.dir))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE).write_text(json.dumps({"total": total, "started": time.time()}))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hc = config.get("hydra")
        if hc is None or str(hc.mode) != "RunMode.MULTIRUN" and str(hc.mode) != "MULTIRUN":
            return
        folder = Path(str(hc.sweep.dir))
        try:
            state = json.loads((folder / STATE).read_text())
        except (OSError, ValueError):
            return
        print(progress_line(int(hc.job.num) + 1, int(state["total"]), finished_jobs(folder),
                            time.time() - float(state["started"])), flush=True)
