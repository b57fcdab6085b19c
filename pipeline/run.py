"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Wires the config to the stages' code. A job runs in this order: every check that needs no model
(types, ranges, the prompt set, a writable outputs folder), the tracking store probed once, then
for each stage either "already complete", a repair of a missing half, or the computation with its
MLflow run open from start to finish.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from pipeline.config.schema import ConfigError, check_config, register  # noqa: E402
from pipeline.jobs.context import StageContext, build_context, load_job_prompts, set_threads  # noqa: E402
from pipeline.engines.option_checks import check_engine  # noqa: E402
from pipeline.jobs.errors import Interrupted, JobEnded, error_line, interrupted_line, precheck, quiet_interrupts  # noqa: E402
from pipeline.jobs.inputs import freeze  # noqa: E402
from pipeline.jobs.runs import JobRuns, format_tags  # noqa: E402
from pipeline.jobs.verdict import conclude  # noqa: E402
from pipeline.jobs.identity import campaign_dir, config_hash, output_path  # noqa: E402
from pipeline.tracking.machine import describe  # noqa: E402
from pipeline.jobs.results import hydra_overrides, now, provenance, write_result  # noqa: E402
from pipeline.jobs.shape_checks import check_shapes  # noqa: E402
from pipeline.stages import stage_module  # noqa: E402
from pipeline.config.stage_options import check_used  # noqa: E402
from pipeline.config.strategy_config import declare_drafters  # noqa: E402
from pipeline.jobs.sweep import end_open_parent, summary_after_failure
from pipeline.jobs.trust import LoadSampler, check_job  # noqa: E402
from pipeline.jobs.workers import dies_with_sweep  # noqa: E402
from speclab.models.loading import resolve_device  # noqa: E402
from store.extend import extension_permitted, job_may_write, refusal  # noqa: E402
from store.layout import STAGES, StoreError  # noqa: E402
from store.locks import file_lock, job_lock_path  # noqa: E402
from store.manifest import is_published  # noqa: E402
from store.records import check_stage_file  # noqa: E402

register()
log = logging.getLogger("speclab")
MIN_FREE_BYTES = 20 * 2**20


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


def validate(cfg: DictConfig):
    """Every check that needs no model; returns the stage parts to run and the prompts."""
    check_config(cfg, STAGES)
    check_used(cfg, list(cfg.stage.parts))
    check_engine(cfg, list(cfg.stage.parts))  # what llama.cpp cannot run, refused before anything loads
    if not str(cfg.outputs_dir).strip():  # an empty folder name would put results in the folder run from
        raise ConfigError(f"outputs_dir={str(cfg.outputs_dir)!r} is not allowed: use a folder path "
                          "(default: outputs/ in the folder you run from)")
    # A published campaign takes no job that would write into it (store.extend), so it is not probed for writing.
    writable = job_may_write(cfg.outputs_dir, str(cfg.campaign), bool(cfg.force), bool(cfg.overwrite_published))
    prompts = load_job_prompts(cfg)
    check_shapes(cfg, prompts)  # trees, k, batches that would not fit in memory: refused before any load
    if writable:
        ensure_writable(campaign_dir(cfg))
    return list(cfg.stage.parts), prompts


class Job:
    """One Hydra job: its stages, their runs (``JobRuns``) and (loaded at most once) its models."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.parts, self.prompts = validate(cfg)
        declare_drafters(cfg)  # what the time model asks of each drafter, from its class
        set_threads(cfg)  # before the runs' machine tags are taken
        freeze(cfg)  # the plan and other files the job reads: one for all its hashes and its stage
        self.runs = JobRuns(cfg)
        self.ctx: StageContext | None = None

    def pending(self) -> list[str]:
        """The stages still to compute; a complete file whose run is missing gets its run logged now.

        A published campaign (``store.manifest``) gains and loses no file: a job there whose files are all
        complete says so; one that would write is refused here, before anything is computed or logged, unless
        ``python -m store.extend`` runs it, and then it may add files but never replace one (``validate``
        refused ``force=true``)."""
        published = is_published(campaign_dir(self.cfg))
        may_add = published and extension_permitted(self.cfg.outputs_dir, str(self.cfg.campaign))
        found = {}  # part -> (path, to write it anew, why the file there is not a finished result or None)
        for part in self.parts:
            path = output_path(self.cfg, part)
            anew = bool(self.cfg.force) or not path.exists()
            found[part] = (path, anew, None if anew else
                           check_stage_file(path, stage_module(part).SCHEMA, config_hash(self.cfg)))
        for part, (path, anew, problem) in found.items() if published else ():
            if anew and not may_add:
                raise refusal(self.cfg.outputs_dir, str(self.cfg.campaign), part, path, hydra_overrides())
            if problem:
                raise StoreError(f"[{part}] {path} is not a finished result ({problem}): it belongs to published "
                                 f"campaign {self.cfg.campaign!r}, so it is left alone")
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
        module, path = stage_module(part), output_path(self.cfg, part)
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


def run_parts(cfg: DictConfig) -> None:
    job = Job(cfg)
    job.runs.close_dead()
    status = "FAILED"
    try:
        with one_writer(cfg, job.parts):
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


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # A job submitit runs (SLURM, submitit_local) must end in an exception, never in an exit or an interrupt:
    # Hydra records the exception as that job's failure and submitit pickles its result, so the sweep goes on
    # and names it, instead of waiting for a result that never comes.
    submitted = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    if submitted and threading.current_thread() is threading.main_thread():
        # Its process is the job's own; submitit ignores SIGTERM, which scancel and preemption send: the job
        # ends like Ctrl-C, its runs KILLED. (A joblib worker keeps SIGTERM's default between jobs: workers.py.)
        signal.signal(signal.SIGTERM, _terminate)
    try:
        with dies_with_sweep():
            run_parts(cfg)
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


def _terminate(signum, frame) -> None:
    # A polite kill (SIGTERM, e.g. from a scheduler) ends the job like Ctrl-C: its run is marked KILLED.
    raise Interrupted(signum)


def user_help(text: str) -> str:
    """Hydra's help without the typed schema's groups (``schema/...``): registered for the config's checks, they
    are not options a user picks."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("schema/"))


def print_user_help() -> None:
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            main()
    finally:  # Hydra ends its help with an exit
        print(user_help(buf.getvalue()), end="", flush=True)


def cli() -> None:
    """``main`` with bad input said in one line (no traceback); HYDRA_FULL_ERROR=1 keeps full traces."""
    from pipeline.tracking.secrets import lift

    # Before Hydra reads the command line: its credentials move to the environment, their masked form stays.
    sys.argv[1:] = lift(sys.argv[1:])
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    if full:
        os.environ["SPECLAB_FULL_ERROR"] = "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors reach us here instead of Hydra's printer
    signal.signal(signal.SIGTERM, _terminate)
    quiet_interrupts()
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        return print_user_help()
    try:
        precheck(sys.argv[1:])
        main()
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM, in a job or a multirun: one line, 130 or 143
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup into a traceback
        end_open_parent("KILLED")
        if full:
            raise
        line, status = interrupted_line(err)
        print(line, file=sys.stderr, flush=True)
        sys.exit(status)
    except Exception as err:  # noqa: BLE001 - sorted below: bad input is one line, a bug keeps its traceback
        summary_after_failure()
        line = None if full else error_line(err)
        if line is None:
            raise
        print(f"speclab: error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:
        end_open_parent("FAILED")  # a multirun that ended normally has closed its parent run already


if __name__ == "__main__":
    cli()
