"""Entry point: ``python -m pipeline.run [stage=NAME] [+sweep=NAME] [overrides]``.

Wires the config to the stages' code. A job runs in this order: every check that needs no model
(types, ranges, the prompt set, a writable outputs folder), the tracking store probed once, then
for each stage either "already complete", a repair of a missing half, or the computation with its
MLflow run open from start to finish.
"""
from __future__ import annotations

import importlib
import logging
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
from pipeline.job_inputs import freeze, job_inputs  # noqa: E402
from pipeline.jobs import campaign_dir, config_hash, output_path, run_identity  # noqa: E402
from pipeline.tracking import PARENT_ENV, end_open_parent  # noqa: E402
from store.layout import STAGES  # noqa: E402

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
    """Readable and distinct in MLflow's run table: stage, k, kinds, round, pair (the hash is a tag)."""
    from pipeline.stages.common import stage_ks

    bits = [part]
    if part == "speed" and cfg.stage.get("best_fixed"):
        bits.append("best-fixed")  # its k is the exploratory check's, not the job's
    elif part in ("acceptance", "speed", "divergence"):
        ks = stage_ks(cfg, "acceptance_ks" if part == "acceptance" else "ks")
        bits.append(f"k{ks[0]}" if len(ks) == 1 else "k" + ",".join(map(str, ks)))
    if cfg.drafter.name != "model":
        bits.append(str(cfg.drafter.name))
    if cfg.k_policy.name != "fixed":
        bits.append(str(cfg.k_policy.name))
    if part == "speed" and cfg.stage.get("recommended"):
        bits.append("+recommended")
    if cfg.sampling.do_sample:
        bits.append(f"T{cfg.sampling.temperature:g}" + (f" p{cfg.sampling.top_p:g}" if cfg.sampling.top_p < 1 else ""))
    skip = int(cfg.prompts.get("skip_per_kind", 0))
    bits.append("+".join(cfg.prompts.kinds) + (f"[{cfg.prompts.per_kind}]" if cfg.prompts.per_kind else "")
                + (f"[skip {skip}]" if skip else ""))
    bits.append(f"r{cfg.round}" + (f" rot{cfg.rotation}" if cfg.rotation else ""))
    bits.append(str(cfg.pair.name))
    return " ".join(bits)


def write_result(rows, schema, path: Path, meta: dict) -> Path:
    """Write a stage's Parquet; if the outputs disk fails now, keep the computed rows in the temp folder."""
    from store.records import write_parquet

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
        from pipeline.jobs import run_params
        from pipeline.tracking import Tracker, resolved_config

        self.cfg = cfg
        self.parts, self.prompts = validate(cfg)
        freeze(cfg)  # the plan and other files the job reads: one for all its hashes and its stage
        self.tracker = Tracker.for_config(cfg)
        self.params = run_params(cfg)
        self.config = resolved_config(cfg)
        self.records: list[dict] = []
        self._tags: dict[str, str] | None = None
        self._parent: str | None = os.environ.get(PARENT_ENV)  # the multirun's run, when there is one
        self._own_parent = False

    def tags(self) -> dict[str, str]:
        if self._tags is None:
            from pipeline.tracking import environment_tags, hydra_tags, machine_tags
            from speclab.models import resolve_device

            env = environment_tags(str(resolve_device(str(self.cfg.device))), str(self.cfg.pair.dtype))
            commit = env.pop("git_commit")  # logged as MLflow's own source tag
            self._tags = {**env, **machine_tags(), **hydra_tags(), "mlflow.source.git.commit": commit,
                          "mlflow.source.name": "pipeline.run", "pair": str(self.cfg.pair.name),
                          "prompts": ",".join(self.cfg.prompts.kinds)}
        return self._tags

    def parent(self) -> str | None:
        """The run the job's stage runs hang under: the multirun's, or (a single job) one opened for the job."""
        if self._parent is None and self.tracker.enabled and not self._own_parent:
            self._own_parent = True
            name = f"job {self.cfg.stage.name} · {_run_name(self.cfg, self.cfg.stage.name).split(' ', 1)[1]}"
            self._parent = self.tracker.start(name, {"stage": "job", "campaign": str(self.cfg.campaign)},
                                              {**self.tags(), "level": "job"}, self.params)
        return self._parent

    def close(self, status: str) -> None:
        if self._own_parent and self._parent:
            if status == "FINISHED":
                lines = [f"{r['stage']}: {r['status']} {r.get('headline', '')}" for r in self.records]
                self.tracker.finish(self._parent, {}, description=lines)
            else:
                self.tracker.end(self._parent, status)
        self._write_record(status)

    def _write_record(self, status: str) -> None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        from pipeline.summary import write_job_record

        hc = HydraConfig.get()
        parts = self.records + [{"stage": p, "status": status.lower()} for p in self.parts
                                if p not in {r["stage"] for r in self.records}]
        write_job_record(Path(hc.runtime.output_dir), {"job": hc.job.get("num", 0),
                                                       "overrides": " ".join(hc.overrides.task), "parts": parts})

    def provenance(self, part: str, started: str) -> dict:
        return {"stage": part, "campaign": str(self.cfg.campaign), "config_hash": config_hash(self.cfg),
                "pair": str(self.cfg.pair.name), "git_commit": self.tags()["mlflow.source.git.commit"],
                "started_at": started, "finished_at": _now(), "overrides": _overrides(),
                "inputs": job_inputs(self.cfg)}

    def _record(self, part: str, status: str, path: Path, metrics: dict | None = None) -> None:
        from pipeline.summary import headline

        self.records.append({"stage": part, "status": status, "file": str(path),
                             "headline": headline(metrics) if metrics else ""})

    def pending(self) -> list[str]:
        """The stages still to compute; a complete file whose run is missing gets its run logged now."""
        from store.records import check_stage_file

        todo = []
        for part in self.parts:
            path, ident = output_path(self.cfg, part), run_identity(self.cfg, part)
            self.tracker.close_stale_runs(ident)
            if self.cfg.force or not path.exists():
                todo.append(part)
                continue
            problem = check_stage_file(path, _stage(part).SCHEMA, ident["config_hash"])
            if problem:
                log.info(f"[{part}] {path} is not a finished result ({problem}): recomputing it")
                todo.append(part)
            elif not self.tracker.enabled or self.tracker.has_finished_run(ident):
                log.info(f"[{part}] already complete for this config: {path} (force=true reruns it)")
                self._record(part, "complete", path)
            else:
                self.log_from_file(part, path)
        return todo

    def _log_run(self, run_id: str | None, part: str, out, path: Path) -> bool:
        """The stage run's metrics, files and description, and one child run per compared arm."""
        ident = run_identity(self.cfg, part)
        self.tracker.log_arms(run_id, out.arms, ident, self.tags(),
                              f"{part} {{arm}} r{self.cfg.round} {self.cfg.pair.name}")
        return self.tracker.finish(run_id, out.metrics, [path], self.config, out.summary)

    def log_from_file(self, part: str, path: Path) -> None:
        """The Parquet was written but its MLflow run never finished: log the run from the file."""
        import pandas as pd

        from store.records import read_meta

        out = _stage(part).summarize(pd.read_parquet(path), self.cfg)
        meta = read_meta(path)
        tags = {**self.tags(), "mlflow.source.git.commit": str(meta.get("git_commit") or "unknown"),
                "logged_from_file": "true"}
        run_id = self.tracker.start(_run_name(self.cfg, part), run_identity(self.cfg, part), tags, self.params,
                                    self.parent())
        if self._log_run(run_id, part, out, path):
            log.info(f"[{part}] {path} was complete but had no finished MLflow run: logged it from the file")
        self._record(part, "logged from file", path, out.metrics)

    def compute(self, todo: list[str]) -> None:
        from pipeline.context import build_context

        ctx = None
        for part in todo:
            module, path = _stage(part), output_path(self.cfg, part)
            # The run opens before the work (the first one before the models load): its duration is the job's.
            run_id = self.tracker.start(_run_name(self.cfg, part), run_identity(self.cfg, part),
                                        self.tags(), self.params, self.parent())
            started = _now()
            try:
                if ctx is None:
                    log.info(f"loading {self.cfg.pair.target} + draft {self.cfg.pair.draft} and "
                             f"{len(self.prompts)} prompts")
                    ctx = build_context(self.cfg, self.prompts)
                log.info(f"[{part}] running: {_run_name(self.cfg, part)}")
                out = module.run(ctx)
                write_result(out.rows, module.SCHEMA, path, self.provenance(part, started))
                logged = self._log_run(run_id, part, out, path)
            except KeyboardInterrupt:
                self.tracker.end(run_id, "KILLED")
                raise
            except BaseException:
                self.tracker.end(run_id, "FAILED")
                raise
            self._record(part, "computed", path, out.metrics)
            log.info(f"[{part}] {self.cfg.pair.name}: wrote {path}" + ("" if logged else " (not logged to MLflow)"))
            for line in out.summary:
                log.info(f"[{part}] {line}")


def run_parts(cfg: DictConfig) -> None:
    job = Job(cfg)
    status = "FAILED"
    try:
        todo = job.pending()
        if todo:
            job.compute(todo)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        job.close(status)


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
    except KeyboardInterrupt:
        end_open_parent("KILLED")
        raise
    except Exception as err:  # noqa: BLE001 - sorted below: bad input is one line, a bug keeps its traceback
        line = None if full else error_line(err)
        if line is None:
            raise
        print(f"speclab: error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:
        end_open_parent("FAILED")  # a multirun that ended normally has closed its parent run already


if __name__ == "__main__":
    cli()
