"""A multirun's own bookkeeping (a Hydra callback): its parent MLflow run, opened once the store is probed, its
jobs' summary table at the end, and what is left to close when a job fails or a worker dies."""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.jobs.summary import RECORD, multirun_summary, sweep_metrics
from pipeline.tracking.mlflow_runs import (PARENT_ENV, PARENT_URI_ENV, SWEEP_DIR_ENV, SWEEP_PID_ENV, Tracker, machine_tags,
                                           note_text, say_unreachable, tracking_problem)
from pipeline.tracking.mlflow_view import SWEPT_ENV, swept_keys
from pipeline.tracking.redact import redact
from store.extend import override_key
from store.records import git_commit


def sweep_name(sweep: str, overrides: list[str], campaign: str, sweep_dir: str) -> str:
    """A sweep run's name: the sweep, what it varies (its sweep overrides, ``k=2,4,6``), the campaign, when it
    started (to the second) and its multirun folder's name, where that is not the time already."""
    swept = set(swept_keys(overrides))
    varies = " ".join(o for o in overrides if override_key(o) in swept)
    folder = Path(sweep_dir).name
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    when = started if folder.replace("-", "").isdigit() else f"{started} · {folder}"  # Hydra's own: the time
    name = "sweep" if sweep == "multirun" else f"sweep {sweep}"  # a command line's sweep: its overrides say it
    return " · ".join(b for b in (f"{name} {varies}".strip(), campaign, when) if b)


class CreateTrackingStore(Callback):
    """Hydra callback: a multirun probes the store once, opens the parent run of its jobs, and ends
    with one summary table of its jobs (printed, and logged on the parent run)."""

    def __init__(self, uri: str, enabled: bool = True, experiment: str = "speclab") -> None:
        self.uri, self.enabled, self.experiment = uri, enabled, experiment
        self.tracker: Tracker | None = None
        self.parent: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _multirun["callback"] = self  # for the launcher and the entry point when a job fails or a worker dies
        os.environ[SWEEP_PID_ENV] = f"{os.getpid()} {platform.node()}"  # joblib workers die with this process
        os.environ[SWEEP_DIR_ENV] = str(config.hydra.sweep.dir)
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
        os.environ[SWEPT_ENV] = " ".join(swept_keys(list(config.hydra.overrides.task),  # for the jobs' run names
                                                    OmegaConf.to_container(params) if params else None))
        if not self.enabled:
            return
        problem = tracking_problem(self.uri, "multirun")
        if problem:
            say_unreachable(self.uri, problem, "every job of this multirun writes Parquet only; rerun the sweep")
            return
        self.tracker = Tracker(self.uri, self.experiment, True)
        self.tracker.close_dead_runs()
        hc = config.hydra  # HydraConfig is not set yet when a multirun starts
        sweep = str(hc.runtime.choices.get("sweep") or "multirun")
        campaign = str(config.campaign)
        name = self.tracker.unique_name(sweep_name(sweep, list(hc.overrides.task), campaign, str(hc.sweep.dir)))
        tags = {"level": "sweep", "sweep": sweep, "campaign": campaign, "sweep_dir": str(hc.sweep.dir),
                "overrides": redact(" ".join(hc.overrides.task))[:5000], "mlflow.source.git.commit": git_commit(),
                "mlflow.source.name": "pipeline.run", **machine_tags()}
        self.parent = self.tracker.start(name, {"stage": "sweep", "campaign": campaign}, tags,
                                         {"sweep": sweep, "overrides": redact(" ".join(hc.overrides.task))})
        if self.parent:
            os.environ[PARENT_ENV], os.environ[PARENT_URI_ENV] = self.parent, self.uri

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        table, lines = multirun_summary(Path(str(config.hydra.sweep.dir)), self.tracker, self.parent)
        if self.tracker and self.parent:
            self.tracker.finish(self.parent, sweep_metrics(table), description=lines, table=table)
        for var in (PARENT_ENV, PARENT_URI_ENV, SWEEP_PID_ENV, SWEEP_DIR_ENV, SWEPT_ENV):
            os.environ.pop(var, None)
        _multirun.pop("callback", None)


_multirun: dict[str, CreateTrackingStore] = {}  # the running multirun's callback, in the multirun's own process


def end_runs_of_dead_workers() -> int:
    """A local worker of the multirun died in its job: the RUNNING runs of dead processes (its job's) become
    KILLED now, not when something next starts. The number of runs ended."""
    sweep = _multirun.get("callback")
    if sweep is None or sweep.tracker is None or not sweep.tracker.enabled:
        return 0
    sweep.tracker.repaired = False  # once per tracker otherwise
    return sweep.tracker.close_dead_runs()


def summary_after_failure() -> None:
    """A multirun whose job failed ends in Hydra's error before its summary: print the summary anyway (each
    job's record says computed, found, failed or killed), so the sweep names the job that failed; with the
    MLflow run it is logged on, which the entry point then ends FAILED. Nothing when no job left a record
    (every job refused its config: the error line says it)."""
    sweep_dir, sweep = os.environ.pop(SWEEP_DIR_ENV, None), _multirun.pop("callback", None)
    if not sweep_dir or not any(Path(sweep_dir).glob(f"*/{RECORD}")):
        return
    tracker, parent = (sweep.tracker, sweep.parent) if sweep is not None else (None, None)
    table, lines = multirun_summary(Path(sweep_dir), tracker, parent)
    if tracker is not None and parent is not None:
        tracker.call(lambda c: (c.set_tag(parent, "mlflow.note.content", note_text(lines)),
                                 [c.log_metric(parent, k, v) for k, v in sweep_metrics(table).items()]))


