"""One job executed, once its config is checked: its stage files locked for one writer, then for each stage either
"already complete", a repair of a missing half (the file's run logged from the file), or the computation with its
MLflow run open from start to finish; its runs closed on every way out, and the job's end said as a job's end is
(``end_as_job``: one line for bad input, an exception in a job submitit runs, SIGTERM taken like Ctrl-C).

The stages' modules sit on a floor above this one (``pipeline.stages``): the entry point passes ``stage_module`` in.
Whether a job may write into a published campaign is the store's (``store.extend``); the lock of a stage file
too (``store.locks``).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType

from omegaconf import DictConfig

from pipeline.config.strategy_config import declare_drafters
from pipeline.jobs.arms import stage_entries
from pipeline.jobs.context import StageContext, build_context, set_threads
from pipeline.jobs.errors import Interrupted, JobEnded, error_line
from pipeline.jobs.identity import campaign_dir, config_hash, output_path
from pipeline.jobs.inputs import freeze
from pipeline.jobs.results import hydra_overrides, now, provenance, write_result
from pipeline.jobs.runs import JobRuns, format_tags
from pipeline.jobs.trust import LoadSampler, check_job
from pipeline.jobs.verdict import conclude
from pipeline.jobs.workers import dies_with_sweep
from pipeline.tracking.machine import describe
from speclab.models.loading import resolve_device
from store.extend import check_published_files
from store.locks import file_lock, job_lock_path
from store.manifest import is_published
from store.records import check_stage_file

log = logging.getLogger("speclab")
MIN_FREE_BYTES = 20 * 2**20
StageModules = Callable[[str], ModuleType]  # a stage's name -> its module (pipeline.stages.stage_module)


def ensure_writable(folder: Path) -> None:
    """Fail before any compute if results could not be written to ``folder``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tmp-probe-"):
            pass
    except OSError as err:
        raise ValueError(f"outputs folder {str(folder)!r} is not writable ({err.strerror or type(err).__name__}): "
                         "choose another with outputs_dir=PATH") from None
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise ValueError(f"outputs folder {str(folder)!r} has {free // 2**20} MiB free: at least "
                         f"{MIN_FREE_BYTES // 2**20} MiB are needed; free space or choose outputs_dir=PATH")


class Job:
    """One Hydra job: its stages, their runs (``JobRuns``) and (loaded at most once) its models. ``parts`` and
    ``prompts`` are what the entry point's checks returned."""

    def __init__(self, cfg: DictConfig, parts: list[str], prompts, stage_module: StageModules) -> None:
        self.cfg = cfg
        self.parts, self.prompts, self.stage_module = parts, prompts, stage_module
        declare_drafters(cfg, [e.drafter for e in stage_entries(cfg) if e.drafter])  # what the time model asks of each drafter
        set_threads(cfg)  # before the runs' machine tags are taken
        freeze(cfg)  # the plan and other files the job reads: one for all its hashes and its stage
        self.runs = JobRuns(cfg, stage_module)
        self.ctx: StageContext | None = None

    def pending(self) -> list[str]:
        """The stages still to compute; a complete file whose run is missing gets its run logged now.

        A published campaign (``store.manifest``) gains and loses no file: a job there whose files are all
        complete says so; one that would write is refused here, before anything is computed or logged, unless
        ``python -m store.extend`` runs it, and then it may add files but never replace one (the entry point's
        checks refused ``force=true``)."""
        published = is_published(campaign_dir(self.cfg))
        found = {}  # part -> (path, to write it anew, why the file there is not a finished result or None)
        for part in self.parts:
            path = output_path(self.cfg, part)
            anew = bool(self.cfg.force) or not path.exists()
            found[part] = (path, anew, None if anew else
                           check_stage_file(path, self.stage_module(part).SCHEMA, config_hash(self.cfg)))
        if published:
            check_published_files(self.cfg.outputs_dir, str(self.cfg.campaign), found, hydra_overrides)
        todo = []
        for part, (path, anew, problem) in found.items():
            if anew or problem:
                if problem:
                    log.info(f"[{part}] {path} is not a finished result ({problem}): recomputing it")
                todo.append(part)
            elif self.runs.logged(part):
                log.info(f"[{part}] already complete for this config: {path}"
                         + ("" if published else " (force=true reruns it)"))
                for line in conclude(self.runs, self.cfg, part, path, "complete"):
                    log.info(f"[{part}] {line}")
            else:
                self.runs.log_from_file(part, path)
        return todo

    def compute(self, part: str) -> None:
        module, path = self.stage_module(part), output_path(self.cfg, part)
        # The run opens before the work (the first one before the models load): its duration is the job's.
        with self.runs.stage_run(part) as run_id:
            started = now()
            if self.ctx is None:
                log.info(f"loading {self.cfg.pair.target} + draft {self.cfg.pair.draft} and "
                         f"{len(self.prompts)} prompts on {describe(str(resolve_device(str(self.cfg.device))))}")
                began = time.monotonic()
                self.ctx = build_context(self.cfg, self.prompts)
                self.ctx.started = began  # a budget of the job's minutes counts its loading too
            log.info(f"[{part}] running: {module.describe(self.cfg)}")
            self.ctx.part_started = time.monotonic()  # a part's own budget (the plan's sample) counts from here
            self.ctx.load = LoadSampler()
            self.ctx.load.sample()  # at the start; the stage samples between its blocks
            out = module.run(self.ctx)
            self.ctx.load.sample()  # at the end
            late = {**format_tags(self.ctx.prompt_record), **check_job(part, out, self.cfg, self.ctx.load,
                                                                              self.ctx.compute_threads())}
            record = provenance(self.cfg, part, started, self.runs.git_commit(), self.ctx.prompt_record)
            write_result(out.rows, module.SCHEMA, path, record)
            logged = self.runs.finish(run_id, part, out, path, late)
        closing = conclude(self.runs, self.cfg, part, path, "computed", out, record["machine"])
        log.info(f"[{part}] {self.cfg.pair.name}: wrote {path}" + ("" if logged else " (not logged to MLflow)"))
        for line in out.summary + closing:
            log.info(f"[{part}] {line}")


@contextmanager
def one_writer(cfg: DictConfig, parts: list[str]) -> Iterator[None]:
    """Hold the lock of each stage file of the job (campaign, stage, config hash) for the job's life: an
    identical job started meanwhile says so in one line and waits, then finds the file complete."""
    def waiting(part: str):
        return lambda holder: print(f"speclab: [{part}] {output_path(cfg, part)} is being computed by "
                                    f"{holder or 'another job'}: waiting for it", file=sys.stderr, flush=True)

    with ExitStack() as locks:
        for part in sorted(parts):  # one order for every job, so two jobs never hold one lock each
            lock = job_lock_path(cfg.outputs_dir, str(cfg.campaign), part, config_hash(cfg))
            locks.enter_context(file_lock(lock, waiting(part)))
        yield


def execute(job: Job) -> None:
    """Run ``job``'s pending stages under one writer's locks; its runs end FINISHED, FAILED or KILLED, its models
    and engines closed on every way out."""
    job.runs.close_dead()
    status = "FAILED"
    try:
        with one_writer(job.cfg, job.parts):
            for part in job.pending():
                job.compute(part)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if job.ctx is not None:
            job.ctx.close()  # an engine's servers stop here on every way out (and die with this process anyway)
        job.runs.close(status, job.parts)


def terminate(signum, frame) -> None:
    # A polite kill (SIGTERM, e.g. from a scheduler) ends the job like Ctrl-C: its run is marked KILLED.
    raise Interrupted(signum)


def end_as_job(run: Callable[[], None]) -> None:
    """``run()``, one Hydra job, ended as a job ends: bad input in one line (exit 2), a traceback only for a bug or
    under SPECLAB_FULL_ERROR=1, and in a job submitit runs always in an exception."""
    # A job submitit runs (SLURM, submitit_local) must end in an exception, never in an exit or an interrupt:
    # Hydra records the exception as that job's failure and submitit pickles its result, so the sweep goes on
    # and names it, instead of waiting for a result that never comes.
    submitted = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    if submitted and threading.current_thread() is threading.main_thread():
        # Its process is the job's own; submitit ignores SIGTERM, which scancel and preemption send: the job
        # ends like Ctrl-C, its runs KILLED. (A joblib worker keeps SIGTERM's default between jobs: workers.py.)
        signal.signal(signal.SIGTERM, terminate)
    try:
        with dies_with_sweep():
            run()
    except KeyboardInterrupt as err:
        if submitted:
            raise JobEnded(f"cancelled ({err}): its runs are KILLED, its finished files kept") from None
        raise
    except Exception as err:  # noqa: BLE001 - said here, inside the job, so Hydra adds no second line
        line = error_line(err)
        if line is None or os.environ.get("SPECLAB_FULL_ERROR") == "1":
            raise
        print(f"speclab: error: {line}", file=sys.stderr)
        if submitted:
            raise JobEnded(line) from None
        sys.exit(2)
