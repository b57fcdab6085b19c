"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Wires the config to the stages' code. A job runs in this order: every check that needs no model
(types, ranges, the prompt set, a writable outputs folder), the tracking store probed once, then
for each stage either "already complete", a repair of a missing half, or the computation with its
MLflow run open from start to finish.
"""
from __future__ import annotations

import importlib
import os
import shutil
import signal
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from pipeline.config_schema import check_config, register  # noqa: E402
from pipeline.errors import error_line, precheck  # noqa: E402
from pipeline.jobs import campaign_dir, config_hash, output_path, run_identity  # noqa: E402
from pipeline.stages import STAGES  # noqa: E402

register()
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
    from pipeline.context import load_job_prompts

    check_config(cfg, STAGES)
    prompts = load_job_prompts(cfg)
    ensure_writable(campaign_dir(cfg))
    return list(cfg.stage.parts), prompts


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _overrides() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None


def _stage(part: str) -> ModuleType:
    return importlib.import_module(f"pipeline.stages.{part}")


def _run_name(cfg: DictConfig, part: str) -> str:
    return f"{part}-{cfg.pair.name}-{config_hash(cfg)[:8]}"


def write_result(rows, schema, path: Path, meta: dict) -> Path:
    """Write a stage's Parquet; if the outputs disk fails now, keep the computed rows in the temp folder."""
    from pipeline.parquet import write_parquet

    try:
        return write_parquet(rows, schema, path, meta)
    except OSError as err:
        rescue = Path(tempfile.gettempdir()) / "speclab-rescue" / path.parent.name / path.name
        write_parquet(rows, schema, rescue, meta)
        raise ValueError(f"could not write {path} ({err.strerror or type(err).__name__}); the results are safe "
                         f"in {rescue}: copy it there once the disk is fixed") from None


class Job:
    """One Hydra job: its stages, its tracker and (loaded at most once) its models."""

    def __init__(self, cfg: DictConfig) -> None:
        from pipeline.tracking import Tracker, flatten, resolved_config

        self.cfg = cfg
        self.parts, self.prompts = validate(cfg)
        self.tracker = Tracker.for_config(cfg)
        self.params = flatten(cfg)
        self.config = resolved_config(cfg)
        self._tags: dict[str, str] | None = None

    def tags(self) -> dict[str, str]:
        if self._tags is None:
            from pipeline.tracking import environment_tags
            from speclab.models import resolve_device

            self._tags = environment_tags(str(resolve_device(str(self.cfg.device))), str(self.cfg.pair.dtype))
        return self._tags

    def provenance(self, part: str, started: str) -> dict:
        return {"stage": part, "campaign": str(self.cfg.campaign), "config_hash": config_hash(self.cfg),
                "pair": str(self.cfg.pair.name), "git_commit": self.tags()["git_commit"], "started_at": started,
                "finished_at": _now(), "overrides": _overrides()}

    def pending(self) -> list[str]:
        """The stages still to compute; a complete file whose run is missing gets its run logged now."""
        from pipeline.parquet import check_stage_file

        todo = []
        for part in self.parts:
            path, ident = output_path(self.cfg, part), run_identity(self.cfg, part)
            self.tracker.close_stale_runs(ident)
            if self.cfg.force or not path.exists():
                todo.append(part)
                continue
            problem = check_stage_file(path, _stage(part).SCHEMA, ident["config_hash"])
            if problem:
                print(f"[{part}] {path} is not a finished result ({problem}): recomputing it")
                todo.append(part)
            elif not self.tracker.enabled or self.tracker.has_finished_run(ident):
                print(f"[{part}] already complete for this config: {path} (force=true reruns it)")
            else:
                self.log_from_file(part, path)
        return todo

    def log_from_file(self, part: str, path: Path) -> None:
        """The Parquet was written but its MLflow run never finished: log the run from the file."""
        import pandas as pd

        from pipeline.parquet import read_meta

        metrics, _ = _stage(part).summarize(pd.read_parquet(path), self.cfg)
        meta = read_meta(path)
        tags = {**self.tags(), "git_commit": str(meta.get("git_commit") or "unknown"), "logged_from_file": "true"}
        run_id = self.tracker.start(_run_name(self.cfg, part), run_identity(self.cfg, part), tags, self.params)
        if self.tracker.finish(run_id, metrics, [path], self.config):
            print(f"[{part}] {path} was complete but had no finished MLflow run: logged it from the file")

    def compute(self, todo: list[str]) -> None:
        from pipeline.context import build_context

        ctx = None
        for part in todo:
            module, path = _stage(part), output_path(self.cfg, part)
            # The run opens before the work (the first one before the models load): its duration is the job's.
            run_id = self.tracker.start(_run_name(self.cfg, part), run_identity(self.cfg, part), self.tags(),
                                        self.params)
            started = _now()
            try:
                ctx = ctx or build_context(self.cfg, self.prompts)
                out = module.run(ctx)
                write_result(out.rows, module.SCHEMA, path, self.provenance(part, started))
                logged = self.tracker.finish(run_id, out.metrics, [path], self.config)
            except KeyboardInterrupt:
                self.tracker.end(run_id, "KILLED")
                raise
            except BaseException:
                self.tracker.end(run_id, "FAILED")
                raise
            print(f"[{part}] {self.cfg.pair.name}: wrote {path}" + ("" if logged else " (not logged to MLflow)"))
            for line in out.summary:
                print(f"[{part}] {line}")


def run_parts(cfg: DictConfig) -> None:
    job = Job(cfg)
    todo = job.pending()
    if todo:
        job.compute(todo)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run_parts(cfg)
    except Exception as err:  # noqa: BLE001 - said here, inside the job, so Hydra adds no second line
        line = error_line(err)
        if line is None or os.environ.get("SPECLAB_FULL_ERROR") == "1":
            raise
        print(f"speclab: error: {line}", file=sys.stderr)
        sys.exit(2)


def _terminate(signum, frame) -> None:
    # A polite kill (SIGTERM, e.g. from a scheduler) ends the job like Ctrl-C: its run is marked KILLED.
    raise KeyboardInterrupt(f"signal {signum}")


def cli() -> None:
    """``main`` with bad input said in one line (no traceback); HYDRA_FULL_ERROR=1 keeps full traces."""
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    if full:
        os.environ["SPECLAB_FULL_ERROR"] = "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors reach us here instead of Hydra's printer
    signal.signal(signal.SIGTERM, _terminate)
    try:
        precheck(sys.argv[1:])
        main()
    except Exception as err:  # noqa: BLE001 - sorted below: bad input is one line, a bug keeps its traceback
        line = None if full else error_line(err)
        if line is None:
            raise
        print(f"speclab: error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
