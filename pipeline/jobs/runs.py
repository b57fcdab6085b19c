"""A job's MLflow runs: its parent run (a single job's own, or the multirun's), one run per stage
named by the stage's ``describe``, one child run per compared arm, and the record the job leaves in
its Hydra folder for the multirun's summary table."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pandas as pd
from omegaconf import DictConfig

from pipeline.jobs.verdict import as_records, conclude
from pipeline.jobs.identity import run_identity, run_params
from pipeline.tracking.redact import redact
from pipeline.jobs.stage_output import ArmResult, StageOutput
from pipeline.jobs.run_names import arm_run_name, grouped_metrics, prompt_set, run_name, shown_metrics
from pipeline.jobs.summary import JOB_METRICS, SWEEP_METRICS, headline, job_metrics, write_job_record
from pipeline.jobs.trust import OK, description_line, run_trust
from pipeline.tracking.mlflow_runs import (
    PARENT_ENV, Tracker, environment_tags, hydra_tags, machine_tags, resolved_config,
)
from speclab.models.loading import resolve_device
from store.layout import STAGES
from store.records import read_meta

log = logging.getLogger("speclab")


def format_tags(prompt_format: dict | None) -> dict[str, str]:
    """MLflow tags of how the prompts were formatted, known once the tokenizer is: ``chat_template_used`` (on,
    off or mixed: what ``prompts.chat_template``, a param, resolved to) and ``two_turn_prompts``."""
    if not prompt_format:
        return {}
    return {"chat_template_used": str(prompt_format["template_used"]),
            "two_turn_prompts": str(prompt_format["two_turn_prompts"])}


class JobRuns:
    """The tracking side of one job: what its runs carry (tags, params, config) and how each ends."""

    def __init__(self, cfg: DictConfig, stage_module: Callable[[str], ModuleType]) -> None:
        self.cfg, self.stage_module = cfg, stage_module  # a stage's module by name: the stages sit a floor above
        self.tracker = Tracker.for_config(cfg)
        self.params, self.config = run_params(cfg), resolved_config(cfg)
        self.records: list[dict] = []  # one per stage: how it ended, its file and headline numbers
        self._tags: dict[str, str] | None = None
        self._parent: str | None = os.environ.get(PARENT_ENV)  # the multirun's run, when there is one
        self._own_parent = False

    def tags(self) -> dict[str, str]:
        if self._tags is None:
            cfg = self.cfg
            env = environment_tags(str(resolve_device(str(cfg.device))), str(cfg.pair.dtype))
            commit = env.pop("git_commit")  # logged as MLflow's own source tag
            self._tags = {**env, **machine_tags(), **hydra_tags(), "mlflow.source.git.commit": commit,
                          "mlflow.source.name": "pipeline.run", "pair": str(cfg.pair.name),
                          "prompts": ",".join(cfg.prompts.kinds), "prompt_set": prompt_set(cfg)}
        return self._tags

    def file_tags(self) -> dict[str, str]:
        """A stage run's (and its arms') tags: ``superseded`` turns true once the file is recomputed, so
        ``tags.superseded = 'false'`` in the MLflow UI shows one run per file."""
        return {**self.tags(), "superseded": "false"}

    def git_commit(self) -> str:
        return self.tags()["mlflow.source.git.commit"]

    def parent(self) -> str | None:
        """The run the job's stage runs hang under: the multirun's, or (a single job) one opened for the job."""
        if self._parent is None and self.tracker.enabled and not self._own_parent:
            self._own_parent = True
            stage = str(self.cfg.stage.name)  # a stage option named like a part is described like it
            own = self.stage_module(stage).describe(self.cfg) if stage in STAGES else run_name(self.cfg, stage)
            name = own.replace(f" · {stage} · ", f" · {stage} job · ", 1)  # what varies stays first
            self._parent = self.tracker.start(name,
                                              {"stage": "job", "campaign": str(self.cfg.campaign)},
                                              {**self.tags(), "level": "job"}, self.params)
        return self._parent

    def close_dead(self) -> None:
        """Runs left RUNNING by dead processes (any job's, any level) become KILLED (once per job)."""
        self.tracker.close_dead_runs()

    def logged(self, part: str) -> bool:
        """Whether the stage's finished run is in MLflow (with tracking off there is nothing to log)."""
        return not self.tracker.enabled or self.tracker.has_finished_run(run_identity(self.cfg, part))

    @contextmanager
    def stage_run(self, part: str) -> Iterator[str | None]:
        """The stage's run, open while the block computes (``Tracker.open_run``)."""
        with self.tracker.open_run(self.stage_module(part).describe(self.cfg), run_identity(self.cfg, part),
                                   self.file_tags(), self.params, self.parent()) as run_id:
            yield run_id

    def finish(self, run_id: str | None, part: str, out: StageOutput, path: Path,
               tags: dict[str, str] | None = None) -> bool:
        """The stage run's metrics, files and description, and one child run per compared arm; ``tags``: what
        is known only once the models are loaded (``format_tags``)."""
        tags, trust, trusted = dict(tags or {}), {}, {}
        description = list(out.summary)
        if (verdict := run_trust(out.rows)) is not None:  # a file logged later carries its verdict in its rows
            tags["trust"] = verdict[0]
            # Also a param and a metric (trusted: 1 or 0, listed right after the headline): the compare view lists
            # params and metrics, not tags.
            trust, trusted = {"trust": verdict[0]}, {"trusted": float(verdict[0] == OK)}
            description.insert(0, description_line(*verdict))
        # MLflow shows the headline rounded (shown_metrics); the Parquet file keeps every digit.
        arms = [ArmResult(a.name, {**a.params, **trust}, {**shown_metrics(grouped_metrics(a.metrics, part)), **trusted})
                for a in out.arms]
        self.tracker.log_arms(run_id, arms, run_identity(self.cfg, part), {**self.file_tags(), **tags},
                              arm_run_name(self.cfg, part, "{arm}"))
        done = self.tracker.finish(run_id, {**shown_metrics(grouped_metrics(out.metrics, part)), **trusted}, [path],
                                   self.config, description, tags=tags, params=trust)
        if done:  # a recomputed file: its older runs are no longer the file's
            self.tracker.supersede(run_identity(self.cfg, part), run_id)
        return done

    def log_from_file(self, part: str, path: Path) -> None:
        """The Parquet was written but its MLflow run never finished: log the run from the file."""
        module = self.stage_module(part)
        out = module.summarize(pd.read_parquet(path), self.cfg)
        meta = read_meta(path)
        tags = {**self.file_tags(), "mlflow.source.git.commit": str(meta.get("git_commit") or "unknown"),
                "logged_from_file": "true", **format_tags(meta.get("prompt_format"))}
        run_id = self.tracker.start(module.describe(self.cfg), run_identity(self.cfg, part), tags, self.params,
                                    self.parent())
        if self.finish(run_id, part, out, path, format_tags(meta.get("prompt_format"))):
            log.info(f"[{part}] {path} was complete but had no finished MLflow run: logged it from the file")
        for line in conclude(self, self.cfg, part, path, "logged from file", out):
            log.info(f"[{part}] {line}")

    def record(self, part: str, status: str, path: Path, metrics: dict | None = None, trust: str = "",
               verdicts: list | None = None) -> None:
        """One stage's entry in the job's record: ``trust`` its checks' state, ``verdicts`` its best per kind
        (pipeline/jobs/verdict.py), both read by the sweep's closing table."""
        self.records.append({"stage": part, "status": status, "file": str(path),
                             "headline": headline(metrics) if metrics else "", "trust": trust,
                             "verdicts": as_records(verdicts or []),
                             **{k: float(metrics[k]) for k in (*SWEEP_METRICS, *JOB_METRICS)
                                if metrics and k in metrics and metrics[k] is not None}})

    def close(self, status: str, parts: list[str]) -> None:
        """End the job's own parent run with the job's status, and leave the job's record."""
        if self._own_parent and self._parent:
            if status == "FINISHED":
                lines = [f"{r['stage']}: {r['status']} {r['headline']}" for r in self.records]
                self.tracker.finish(self._parent, job_metrics(self.records), description=lines)
            else:
                self.tracker.end(self._parent, status)
        if status == "KILLED":  # an interrupt may land between a run's creation and its id's return
            self.tracker.end_runs_of_this_process(status)
        self._write_record(status, parts)

    def _write_record(self, status: str, parts: list[str]) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return
        hc = HydraConfig.get()
        done = {r["stage"] for r in self.records}
        write_job_record(Path(hc.runtime.output_dir), {
            "job": hc.job.num if hc.mode == RunMode.MULTIRUN else 0, "overrides": redact(" ".join(hc.overrides.task)),
            "parts": self.records + [{"stage": p, "status": status.lower(), "file": "", "headline": ""}
                                     for p in parts if p not in done]})
