"""MLflow tracking of stage jobs: a run opens when the job starts and finishes only after its Parquet is written.

Tracking is optional: a store that cannot be reached is found out once per process (a short
probe, no retry loop), said in one line, and the jobs go on writing Parquet without it.
Every run ends: each carries its process (host, pid, start time), and the next job or multirun
to start on that host marks the RUNNING runs of dead processes KILLED, whoever's they are.
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.tracking.mlflow_view import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from pipeline.tracking.redact import redact, redact_all
from pipeline.tracking.secrets import resolve
from store.credentials import public_url
from store.locks import tracking_store_lock
from store.mlflow_probe import first_line, unreachable
from pipeline.tracking.machine import cpu_model
from store.records import git_commit

# Bound MLflow's own HTTP retries (by default minutes against a dead server) unless the user chose.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # store creation and migrations are not news
# MLflow's own "View run ... at: URL" line prints the tracking URI with its credentials: ours (run_link) does not.
os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"

PACKAGES = ("torch", "transformers", "speclab", "mlflow", "hydra-core", "numpy", "scipy")
# Set for child processes (joblib, submitit) once a store was found unreachable: they skip it at once,
# told why and when (DOWN_WHY_ENV): at the start of the multirun, or during it.
DOWN_ENV = "SPECLAB_TRACKING_DOWN"
DOWN_WHY_ENV = "SPECLAB_TRACKING_DOWN_WHY"
_down: dict[str, str] = {}  # tracking URI -> why it cannot be used, found out once per process
_said: set[str] = set()  # URIs whose outage was already reported by this process
MULTIRUN_DOWN = "found unreachable when the multirun started"  # how tracking_problem's why begins in a multirun
log = logging.getLogger("speclab")
# MLflow logs a database error as a traceback on its own stderr handler (an interrupt inside a sqlite commit, a
# locked or full store) before raising it; Tracker.call says the outage once, in one line, instead.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


NOTE_LIMIT = 8000  # MLflow's limit on a tag's value (a run's description): it truncates longer ones with a warning


def note_text(lines: list[str], limit: int = NOTE_LIMIT) -> str:
    """A run's description: its lines, whole, up to MLflow's limit, then how many were left out and where they are."""
    text = "\n".join(lines)
    if len(text) <= limit:
        return text
    kept, size = [], 0
    for line in lines:
        if size + len(line) + 1 > limit - 120:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept + [f"... {len(lines) - len(kept)} more lines: the job's console log and its Parquet file "
                              "hold them (MLflow keeps 8,000 characters)"])


def environment_tags(device: str, dtype: str) -> dict[str, str]:
    tags = {"git_commit": git_commit(), "device": device, "dtype": dtype, "host": platform.node(),
            "python": sys.version.split()[0]}
    for pkg in PACKAGES:
        try:
            tags[f"version.{pkg}"] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return tags


def _set_down(uri: str, why: str) -> None:
    _down[uri] = why
    os.environ[DOWN_ENV], os.environ[DOWN_WHY_ENV] = uri, why


def tracking_problem(uri: str, starting: str = "job") -> str | None:
    """Probe ``uri`` once per process (and once per multirun, through the environment); ``starting``
    names what is starting (a job, a multirun), for the message a later job of the multirun reads."""
    if uri not in _down:
        inherited = os.environ.get(DOWN_WHY_ENV) if os.environ.get(DOWN_ENV) == uri else None
        if inherited:
            _down[uri] = inherited
        else:
            try:
                with tracking_store_lock(uri):  # a new sqlite store is created here, by one process at a time
                    problem = unreachable(resolve(uri))
            except OSError as err:  # the lock beside a sqlite file: a full or read-only disk is an outage too
                what = err.strerror or first_line(err)
                problem = f"{err.filename}: {what}" if err.filename else f"its lock file cannot be written: {what}"
            _down[uri] = ""
            if problem:
                _set_down(uri, f"found unreachable when the {starting} started: {problem}")
    return _down[uri] or None


def _said_by_multirun(uri: str) -> bool:
    """Whether this process is a local worker of a multirun that found ``uri`` down as it started, and said so."""
    pid, _, host = os.environ.get(SWEEP_PID_ENV, "").partition(" ")
    return (os.environ.get(DOWN_ENV) == uri and os.environ.get(DOWN_WHY_ENV, "").startswith(MULTIRUN_DOWN)
            and pid == str(os.getppid()) and host == platform.node())


def say_unreachable(uri: str, problem: str, consequence: str) -> None:
    """One line per store, however many jobs (and local worker processes) find it down."""
    if uri not in _said and not _said_by_multirun(uri):
        _said.add(uri)
        print(redact(f"speclab: MLflow at {uri} is unreachable ({problem}): {consequence} once it is back to log them"),
              file=sys.stderr)


def _mark_down(uri: str, err: BaseException) -> None:
    during = "the multirun" if os.environ.get(PARENT_ENV) else "the job"
    _set_down(uri, f"became unreachable during {during}: {first_line(err)}")
    _said.add(uri)  # this line is the process's one report of the outage
    print(redact(f"speclab: warning: MLflow at {uri} failed ({first_line(err)}); the rest of this process writes "
                 "Parquet only (rerun the job later to log it)"), file=sys.stderr)


def process_tags() -> dict[str, str]:
    """The process a run belongs to: its host, pid and start time (a pid alone may be reused)."""
    import psutil

    return {"speclab.host": platform.node(), "speclab.pid": str(os.getpid()),
            "speclab.pid_started": repr(psutil.Process().create_time())}


def process_dead(tags: dict[str, str]) -> bool:
    """Whether the process that opened a run (``process_tags``) is gone; False when that cannot be told
    (another host, or a run opened by something else)."""
    import psutil

    if tags.get("speclab.host") != platform.node() or not (tags.get("speclab.pid") or "").isdigit():
        return False
    try:
        process = psutil.Process(int(tags["speclab.pid"]))
        if process.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its (dead) parent
            return True
        started = process.create_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    return "speclab.pid_started" in tags and tags["speclab.pid_started"] != repr(started)


# Hydra groups whose chosen option names a run's setting (``prompts: smoke``, ``sweep: speed``).
GROUPS = ("pair", "prompts", "stage", "sampling", "drafter", "k_policy", "sweep", "launcher")
PARENT_ENV = "SPECLAB_PARENT_RUN"  # the multirun's run, for its jobs (also in launcher subprocesses)
PARENT_URI_ENV = "SPECLAB_PARENT_URI"
SWEEP_PID_ENV = "SPECLAB_SWEEP_PROCESS"  # "<pid> <host>" of the multirun's own process
SWEEP_DIR_ENV = "SPECLAB_SWEEP_DIR"  # the multirun's folder, for a summary when a job's failure ends the sweep


def machine_tags() -> dict[str, str]:
    """Where the numbers were measured: timings only compare within one machine and load."""
    import psutil
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"host": platform.node(), "cpu_model": cpu_model(), "cpu_count": str(os.cpu_count()),
            "torch_threads": str(torch.get_num_threads()), "load_1m": f"{load[0]:.2f}",
            "memory_gb": f"{psutil.virtual_memory().total / 2**30:.1f}"}


def hydra_tags() -> dict[str, str]:
    """The sweep, the overrides and the chosen option of each config group, when Hydra runs the job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    choices = hc.runtime.choices
    tags = {f"choice.{g}": str(choices[g]) for g in GROUPS if choices.get(g) is not None}
    tags["sweep"] = str(choices.get("sweep") or "none")
    tags["overrides"] = redact(" ".join(hc.overrides.task))[:5000]
    return tags


def experiment_id(client: Any, name: str) -> str:
    """The experiment's id, created if new; either way of MLflow 3's classic-ML kind (``EXPERIMENT_KIND``), so a UI
    that reads the kind opens it on its runs, not on the GenAI overview (an experiment without the tag gets it)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in exp.tags:  # one the user chose a kind for keeps it
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


@dataclass
class Tracker:
    """The MLflow side of a job's runs. ``enabled`` is False when tracking is off or unreachable."""

    uri: str
    experiment: str
    enabled: bool
    _client: Any = None
    _experiment_id: str | None = None
    _open: set[str] = field(default_factory=set)  # ids of the runs this process opened and has not ended
    repaired: bool = False  # the RUNNING runs of dead processes were closed (once per tracker)
    _creating: bool = False  # a run is being created (an interrupt there leaves one whose id this process lacks)

    def __getstate__(self) -> dict:
        # The client holds the URI with its credentials (pipeline/tracking/secrets.py): a launcher that pickles this tracker
        # (submitit pickles Hydra's callbacks with each job) gets it without, and connects again when needed.
        return {**self.__dict__, "_client": None}

    @classmethod
    def for_config(cls, cfg: DictConfig) -> Tracker:
        uri, enabled = str(cfg.mlflow.tracking_uri), bool(cfg.mlflow.enabled)
        if enabled:
            problem = tracking_problem(uri)
            if problem:
                say_unreachable(uri, problem, "results are written to Parquet only; rerun the same command")
                enabled = False
        return cls(uri, str(cfg.mlflow.experiment), enabled)

    def call(self, fn, *args, **kwargs) -> Any:
        """One MLflow call; a failure turns tracking off for the rest of the process instead of raising."""
        if not self.enabled or _down.get(self.uri):
            return None
        try:
            if self._client is None:
                import mlflow

                with tracking_store_lock(self.uri):  # two new jobs must not both create the experiment
                    client = mlflow.MlflowClient(resolve(self.uri))
                    self._experiment_id = experiment_id(client, self.experiment)
                self._client = client
            return fn(self._client, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - a dead server must not cost the measured results
            self.enabled = False
            _mark_down(self.uri, err)
            return None

    def _search(self, identity: dict[str, str], status: str | None) -> list:
        clauses = [f"tags.{k} = '{v}'" for k, v in identity.items()]
        clauses += [f"attributes.status = '{status}'"] if status else []

        def search(c):
            runs, token = [], None
            while True:
                page = c.search_runs([self._experiment_id], " and ".join(clauses), max_results=1000, page_token=token)
                runs += page
                token = page.token
                if not token:
                    return runs

        return self.call(search) or []

    def unique_name(self, name: str) -> str:
        """``name``, or ``name #2`` (#3...) when a sweep run of the experiment already has it: two sweeps started
        in the same second from folders of the same name still get names of their own."""
        names = {r.info.run_name for r in self._search({"level": "sweep"}, None)}
        candidate, i = name, 1
        while candidate in names:
            i += 1
            candidate = f"{name} #{i}"
        return candidate

    def has_finished_run(self, identity: dict[str, str]) -> bool:
        return bool(self._search(identity, "FINISHED"))

    def close_dead_runs(self) -> int:
        """Mark KILLED every RUNNING run (stage, job, sweep or arm, anyone's) whose process on this host is
        gone: killed by a signal it could not catch, out of memory, or cut off from the store. Once per tracker."""
        if self.repaired:
            return 0
        self.repaired = True
        dead = [run.info.run_id for run in self._search({}, "RUNNING") if process_dead(run.data.tags)]
        for run_id in dead:
            self.call(lambda c, rid=run_id: c.set_terminated(rid, "KILLED"))
        if dead:
            log.info(f"MLflow: {len(dead)} run(s) left RUNNING by processes that died are now KILLED")
        return len(dead)

    def end_runs_of_this_process(self, status: str) -> int:
        """End every run this process opened and left RUNNING, one whose creation an interrupt cut short (in the
        store, its id never returned: found by this process's host, pid and start time) included. Best effort and
        quiet: it runs on the way out of an interrupt, when the store may be busy with the other workers' ends."""
        for run_id in list(self._open):
            self.end(run_id, status)
        if not self._creating or self._client is None or not self.enabled:
            return 0
        self._creating = False
        me = process_tags()
        try:
            runs = self._client.search_runs([self._experiment_id], "attributes.status = 'RUNNING'", max_results=1000)
            mine = [r.info.run_id for r in runs if all(r.data.tags.get(k) == v for k, v in me.items())]
            for run_id in mine:
                self._client.set_terminated(run_id, status)
        except Exception:  # noqa: BLE001 - the next start closes what is left (close_dead_runs)
            return 0
        return len(mine)

    def supersede(self, identity: dict[str, str], run_id: str | None) -> int:
        """Tag ``superseded=true`` the older FINISHED runs of the same file (campaign, stage, config hash;
        stage runs and their arms) once ``run_id`` recomputed it, so one run per file stays current."""
        if run_id is None:
            return 0
        same_file = {k: v for k, v in identity.items() if k != "level"}
        old = [r.info.run_id for r in self._search(same_file, "FINISHED")
               if r.info.run_id != run_id and r.data.tags.get("mlflow.parentRunId") != run_id
               and r.data.tags.get("superseded") != "true"]
        for rid in old:
            self.call(lambda c, r=rid: (c.set_tag(r, "superseded", "true"), c.set_tag(r, "superseded_by", run_id)))
        return len(old)

    def start(self, name: str, identity: dict[str, str], tags: dict[str, str], params: dict[str, Any],
              parent: str | None = None) -> str | None:
        """Open a RUNNING run now, so its duration is the job's; None when tracking is off."""
        all_tags = {**tags, **identity, **process_tags(), **({"mlflow.parentRunId": parent} if parent else {})}

        def create(c):
            from mlflow.entities import Param

            run = c.create_run(self._experiment_id, run_name=name, tags=all_tags)
            items = [Param(k, ("" if v is None else str(v))[:500]) for k, v in params.items()]
            for i in range(0, len(items), 100):
                c.log_batch(run.info.run_id, params=items[i:i + 100])
            return run.info.run_id

        self._creating = True  # stays True when an interrupt lands before the id comes back
        run_id = self.call(create)
        self._creating = False
        if run_id:
            self._open.add(run_id)
        return run_id

    def finish(self, run_id: str | None, metrics: dict[str, float], artifacts: list[Path] = (),
               config: dict | None = None, description: list[str] = (), table: Any = None,
               tags: dict[str, str] | None = None, link: bool = True, params: dict[str, str] | None = None) -> bool:
        """Log metrics, late ``params``, artifacts, the resolved config, the description and late ``tags``, then mark
        the run FINISHED (and print where to see it, when ``link`` and the store has a UI)."""
        if run_id is None:
            return False

        def log(c):
            from mlflow.entities import Metric, Param

            now = int(time.time() * 1000)
            items = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None and v == v]
            for i in range(0, len(items), 500):
                c.log_batch(run_id, metrics=items[i:i + 500])
            if params:
                c.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
            for path in artifacts:
                c.log_artifact(run_id, str(path))
            if config is not None:
                c.log_dict(run_id, config, "config.yaml")
            if table is not None:
                c.log_table(run_id, data=table, artifact_file="summary.json")
            if description:
                c.set_tag(run_id, "mlflow.note.content", note_text(description))
            for key, value in (tags or {}).items():
                c.set_tag(run_id, key, value)
            c.set_terminated(run_id, "FINISHED")
            return True

        done = bool(self.call(log))
        if done:
            self._open.discard(run_id)
            if link and (url := self.run_link(run_id)):
                logging.getLogger("speclab").info(f"MLflow run: {url}")  # (``log`` is the local function above)
        return done

    def run_link(self, run_id: str) -> str | None:
        """The run's page on an http(s) store's UI, without the URI's credentials; None for other stores."""
        base = public_url(self.uri)
        return f"{base}/#/experiments/{self._experiment_id}/runs/{run_id}" if base else None

    def log_arms(self, parent: str | None, arms: list, identity: dict[str, str], tags: dict[str, str],
                 name_pattern: str) -> int:
        """One finished child run per arm: the same metric names in every child, the arm's settings as params."""
        if parent is None:
            return 0
        n = 0
        for arm in arms:
            # k and kind also as tags: the run table's search box filters on tags (tags.kind = 'code').
            arm_tags = {**tags, **{key: str(arm.params[key]) for key in ("k", "kind") if key in arm.params}}
            run_id = self.start(name_pattern.format(arm=arm.name), {**identity, "level": "arm"}, arm_tags, arm.params,
                                parent)
            n += self.finish(run_id, arm.metrics, link=False)
        return n

    @contextmanager
    def open_run(self, name: str, identity: dict[str, str], tags: dict[str, str], params: dict[str, Any],
                 parent: str | None = None) -> Iterator[str | None]:
        """A run open while the block runs (``start``): the block marks it FINISHED (``finish``); an
        interrupt (Ctrl-C, SIGTERM) ends it KILLED and an error FAILED, so it never stays RUNNING."""
        run_id = self.start(name, identity, tags, params, parent)
        try:
            yield run_id
        except KeyboardInterrupt:
            self.end(run_id, "KILLED")
            raise
        except BaseException:
            self.end(run_id, "FAILED")
            raise

    def end(self, run_id: str | None, status: str) -> None:
        """Close a run that did not finish (FAILED, KILLED): never leave it RUNNING."""
        if run_id is not None and run_id in self._open:
            self.call(lambda c: c.set_terminated(run_id, status))
            self._open.discard(run_id)


def resolved_config(cfg: DictConfig) -> dict:
    """The job's config as plain data (logged as the run's config.yaml)."""
    return redact_all(OmegaConf.to_container(cfg, resolve=True))


def end_open_parent(status: str) -> None:
    """A multirun that died: its parent run must not stay RUNNING (called by the entry point)."""
    parent, uri = os.environ.pop(PARENT_ENV, None), os.environ.pop(PARENT_URI_ENV, None)
    if parent and uri and not _down.get(uri):
        try:
            import mlflow

            client = mlflow.MlflowClient(resolve(uri))
            if client.get_run(parent).info.status == "RUNNING":
                client.set_terminated(parent, status)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
