"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Composes the config (Hydra), runs every check that needs no model (types, ranges, the prompt set, a writable
outputs folder) and dispatches the job, with the stages' code, to ``pipeline.jobs.execute``: the tracking store
probed once, then for each stage "already complete", a repair of a missing half, or the computation.
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys
from contextlib import redirect_stdout

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from pipeline.config.legacy_flags import LEGACY_FLAGS_ENV, command_line, with_flags  # noqa: E402
from pipeline.config.schema import ConfigError, check_config, register  # noqa: E402
from pipeline.config.stage_options import check_used  # noqa: E402
from pipeline.engines.option_checks import check_engine  # noqa: E402
from pipeline.jobs.context import load_job_prompts  # noqa: E402
from pipeline.jobs.errors import error_line, interrupted_line, precheck, quiet_interrupts  # noqa: E402
from pipeline.jobs.execute import Job, end_as_job, ensure_writable, execute, terminate  # noqa: E402
from pipeline.jobs.identity import campaign_dir  # noqa: E402
from pipeline.jobs.shape_checks import check_shapes  # noqa: E402
from pipeline.tracking.mlflow_runs import end_open_parent  # noqa: E402
from pipeline.jobs.sweep import summary_after_failure  # noqa: E402
from pipeline.stages import stage_module  # noqa: E402
from store.extend import job_may_write  # noqa: E402
from store.layout import STAGES  # noqa: E402

register()


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


def open_job(cfg: DictConfig) -> Job:
    """The job of ``cfg`` once every check that needs no model has passed (its threads set, its inputs frozen)."""
    return Job(cfg, *validate(cfg), stage_module)


def run_parts(cfg: DictConfig) -> None:
    execute(open_job(cfg))


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    flags = json.loads(os.environ.get(LEGACY_FLAGS_ENV) or "{}")
    end_as_job(lambda: run_parts(with_flags(cfg, flags)))


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
    signal.signal(signal.SIGTERM, terminate)
    quiet_interrupts()
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        return print_user_help()
    try:
        sys.argv[1:], flags = command_line(sys.argv[1:])  # a recorded command's flags from before stage.arms
        os.environ[LEGACY_FLAGS_ENV] = json.dumps(flags)  # its jobs' hashes are named by them (main)
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
