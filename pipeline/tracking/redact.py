"""The pipeline's last line of defence for credentials: every string a writer records or prints is masked by
``redact`` (store/credentials.py: ``http://alice:***@host/?token=***``, through Hydra's escaping too).

The credentials of the command line never reach Hydra (pipeline/tracking/secrets.py lifts them out first); this mask
covers what comes some other way (a URI interpolated from the environment, a library's error message). One
helper for every writer: the Parquet provenance record, MLflow tags, params and the config artifact, the job
record, Hydra's own files in a job's folder (``RedactHydraFiles``), log lines (``RedactFilter`` on the logging
handlers of conf/hydra/) and the lines printed to stderr.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from store.credentials import MASK, redact, redact_all

__all__ = ["MASK", "RedactFilter", "RedactHydraFiles", "redact", "redact_all", "redact_file"]


class RedactFilter(logging.Filter):
    """A logging filter (on a handler) that redacts each record's message, Hydra's launcher lines included."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def redact_file(path: Path) -> None:
    """Rewrite a text file with its URIs redacted (untouched when it holds none)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    clean = redact(text)
    if clean != text:
        path.write_text(clean)


class RedactHydraFiles(Callback):
    """Hydra saves a job's config and overrides (``.hydra/*.yaml``, a multirun's ``multirun.yaml``) before any
    code of the job runs: redact them as the job starts and as the multirun ends."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hc = config.hydra
        if hc.output_subdir is not None:
            for path in (Path(str(hc.runtime.output_dir)) / str(hc.output_subdir)).glob("*.yaml"):
                redact_file(path)
        self._sweep_file(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_file(config)

    @staticmethod
    def _sweep_file(config: DictConfig) -> None:
        sweep_dir = OmegaConf.select(config, "hydra.sweep.dir")
        if sweep_dir:
            redact_file(Path(str(sweep_dir)) / "multirun.yaml")
