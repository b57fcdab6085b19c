"""A local parallel multirun (``+launcher=joblib``) where one dead worker fails its own job alone.

Hydra's joblib launcher runs every job in one loky executor: when a worker dies (SIGKILL, the
out-of-memory killer, a crash in native code) loky kills every other worker and the whole sweep ends
in a traceback, with the jobs it cut short left RUNNING in MLflow. Here each of the ``n_jobs`` slots
has an executor of one worker of its own (reused from job to job, as loky's would be), so a worker's
death breaks only its slot: its job fails with why ("worker killed by signal 9"), the job's runs are
ended KILLED at once, its record names it in the sweep's summary, and the slot takes the next job in
a new worker. The sweep then ends as Hydra ends any sweep with a failed job: non-zero.

An interrupt of the multirun (Ctrl-C, SIGTERM) reaches the running jobs (their runs end KILLED), then
the workers are stopped and the interrupt goes on to the entry point, which says it in one line.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import OmegaConf, open_dict

from pipeline.jobs.errors import JobEnded
from pipeline.tracking.redact import redact
from store.mlflow_probe import first_line

log = logging.getLogger(__name__)
STOP_GRACE_S = 15.0  # after an interrupt, how long a job gets to end its runs KILLED (twice: Ctrl-C, then SIGTERM)


@dataclass
class Ended:
    """What a worker hands back when its job ended by an interrupt or an exit instead of Hydra's result."""

    how: str


def _idle_worker() -> None:
    # Ctrl-C reaches every process of the terminal: an idle worker leaves it to the multirun's process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupt_once(signum, frame) -> None:
    # The job ends its runs KILLED on the way out: a second Ctrl-C or SIGTERM must not cut that short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_in_worker(*args: Any) -> JobReturn | Ended:
    """One job in a worker (Hydra's ``execute_job``); an interrupt or exit comes back as ``Ended``, never
    as an exception the multirun would take for its own."""
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return execute_job(*args)
    except KeyboardInterrupt as err:
        return Ended(f"was interrupted ({err})" if str(err) else "was interrupted")
    except SystemExit as err:
        return Ended(f"exited with status {err.code}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def death(err: BaseException) -> str:
    """How a worker died, from loky's error (it names the exit code of its one worker)."""
    codes = [int(c) for c in re.findall(r"\((-?\d+)\)", str(err))]
    if codes and codes[0] < 0:
        try:
            name = f", {signal.Signals(-codes[0]).name}"
        except ValueError:
            name = ""
        return f"worker killed by signal {-codes[0]}{name}"
    if codes:
        return f"worker exited with status {codes[0]}"
    return f"worker lost ({type(err).__name__})"


def workers(n_jobs: Any, jobs: int) -> int:
    """joblib's ``n_jobs`` (-1: every CPU, -2: all but one, ...) as a number of workers for ``jobs`` jobs."""
    n = int(n_jobs if n_jobs is not None else -1)
    if n < 0:
        n = max((os.cpu_count() or 1) + 1 + n, 1)
    return max(1, min(n, jobs))


class Slots:
    """``n`` executors of one loky worker each, started when first given a job."""

    def __init__(self, n: int) -> None:
        self.executors: list[Any] = [None] * n

    def submit(self, slot: int, fn, *args: Any) -> Future:
        from joblib.externals.loky.process_executor import ProcessPoolExecutor

        if self.executors[slot] is None:
            self.executors[slot] = ProcessPoolExecutor(max_workers=1, initializer=_idle_worker)
        return self.executors[slot].submit(fn, *args)

    def drop(self, slot: int) -> None:
        """The slot's worker died: its executor is broken; the next job gets a new one."""
        executor, self.executors[slot] = self.executors[slot], None
        if executor is not None:
            executor.shutdown(wait=False, kill_workers=True)

    def signal_workers(self, slots: list[int], signum: int) -> None:
        for slot in slots:
            for pid in list(getattr(self.executors[slot], "_processes", None) or {}):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def close(self, kill: bool = False) -> None:
        for slot, executor in enumerate(self.executors):
            if executor is not None:
                executor.shutdown(wait=True, kill_workers=kill)
            self.executors[slot] = None


def _failed(overrides: Sequence[str], err: BaseException) -> JobReturn:
    ret = JobReturn()
    ret.overrides = [redact(o) for o in overrides]
    ret.status = JobStatus.FAILED
    ret.return_value = err
    return ret


def _job_record_place(launcher: Any, idx: int, overrides: Sequence[str]) -> tuple[Path, list[str]]:
    """The folder a job writes its record to and its stage parts, composed as its worker composed them."""
    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(config):
        config.hydra.job.id = f"{config.hydra.job.name}_{idx}"
        config.hydra.job.num = idx
    subdir = OmegaConf.select(config, "hydra.sweep.subdir")
    return Path(str(config.hydra.sweep.dir)) / str(subdir), [str(p) for p in config.stage.parts]


def record_failure(launcher: Any, idx: int, overrides: Sequence[str], why: str, since: float) -> None:
    """A job that ended without leaving its record (its worker died, or it stopped before its runs): one
    for the sweep's summary, each stage ``failed (why)``. A record the job wrote itself is kept."""
    from pipeline.jobs.summary import RECORD, write_job_record

    try:
        folder, parts = _job_record_place(launcher, idx, overrides)
    except Exception:  # noqa: BLE001 - a job whose config does not compose has said so itself
        folder, parts = Path(str(launcher.config.hydra.sweep.dir)) / str(idx), ["job"]
    path = folder / RECORD
    if path.exists() and path.stat().st_mtime >= since:
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_job_record(folder, {"job": idx, "overrides": redact(" ".join(overrides)),
                              "parts": [{"stage": p, "status": f"failed: {why}", "file": "", "headline": ""}
                                        for p in parts]})


def _outcome(future: Future) -> tuple[JobReturn | None, str]:
    """A finished job's result from Hydra, or why there is none (its worker died, it was interrupted or exited)."""
    from joblib.externals.loky.process_executor import BrokenProcessPool

    err = future.exception()
    if isinstance(err, BrokenProcessPool):
        return None, death(err)
    if err is not None:
        return None, first_line(err)
    value = future.result()
    if isinstance(value, Ended):
        return None, value.how
    return value, ""


@dataclass
class Running:
    slot: int
    index: int  # in this batch
    started: float


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Hydra's launch: every job run, a failed one failing alone; the results in the order of the jobs."""
    from joblib.externals.loky.process_executor import BrokenProcessPool

    from pipeline.jobs.sweep import end_runs_of_dead_workers

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    n = workers(launcher.joblib.get("n_jobs"), len(job_overrides))
    log.info(f"{n} local worker(s), each its own process, are launching {len(job_overrides)} jobs")
    log.info(f"Launching jobs, sweep output dir : {sweep_dir}")
    for idx, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + idx} : {redact(' '.join(filter_overrides(overrides)))}")

    common = set.intersection(*(set(o) for o in job_overrides)) if job_overrides else set()
    state = Singleton.get_state()
    slots, todo = Slots(n), deque(range(len(job_overrides)))
    results: dict[int, JobReturn] = {}
    running: dict[Future, Running] = {}
    stopped = False
    try:
        while todo or running:
            for slot in sorted(set(range(n)) - {r.slot for r in running.values()}):
                if todo:
                    i = todo.popleft()
                    future = slots.submit(slot, run_in_worker, initial_job_idx + i, job_overrides[i],
                                          launcher.hydra_context, launcher.config, launcher.task_function, state)
                    running[future] = Running(slot, i, time.time())
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                idx, overrides = initial_job_idx + job.index, job_overrides[job.index]
                varied = [o for o in filter_overrides(overrides) if o not in common]
                name = f"job #{idx}" + (f" ({redact(' '.join(varied))})" if varied else "")
                value, why = _outcome(future)
                if isinstance(value, JobReturn):
                    results[job.index] = value
                    continue
                if isinstance(future.exception(), BrokenProcessPool):  # the slot's worker is gone, and its runs
                    slots.drop(job.slot)
                    end_runs_of_dead_workers()
                log.error(f"{name} failed: {why}; the other jobs go on")
                record_failure(launcher, idx, overrides, why, job.started)
                results[job.index] = _failed(overrides, JobEnded(f"{name} failed: {why}"))
    except KeyboardInterrupt as err:
        stopped = True
        _stop(slots, running, polite=getattr(err, "signum", signal.SIGINT) == signal.SIGINT)
        # A job interrupted while its run was being created cannot end a run it never got the id of: once its
        # worker is gone, every RUNNING run of a dead process is ended KILLED here.
        slots.close(kill=True)
        end_runs_of_dead_workers()
        raise
    finally:
        slots.close(kill=stopped)
    return [results[i] for i in range(len(job_overrides))]


def _stop(slots: Slots, running: dict[Future, Running], polite: bool) -> None:
    """An interrupt of the multirun: the running jobs end their runs KILLED within a bounded time. A Ctrl-C
    from the terminal (``polite``) has reached them already: they get time to end before a SIGTERM; after
    any other interrupt they get the SIGTERM at once. Workers still busy after that are killed (``close``)."""
    try:
        if polite:
            wait(list(running), timeout=STOP_GRACE_S)
        slots.signal_workers([r.slot for f, r in running.items() if not f.done()], signal.SIGTERM)
        wait(list(running), timeout=STOP_GRACE_S)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        pass
