"""Credentials in URIs never reach a record: ``http://user:password@host/?token=t`` is written and printed as
``http://user:***@host/?token=***``.

One helper for every writer: the Parquet provenance record, MLflow tags, params and the config artifact,
the job record, Hydra's own files in a job's folder (``RedactHydraFiles``), log lines (``RedactFilter`` on
the logging handlers of conf/hydra/) and the lines printed to stderr. The job itself still connects with
the URI as given.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

MASK = "***"
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
# Query parameters whose values are secrets (matched case-insensitively, '-' and '_' alike).
SECRET_PARAMS = re.compile(r"(^|[_-])(token|passw(or)?d|pwd|secret|api[_-]?key|key|auth|sig(nature)?|credentials?)$",
                           re.IGNORECASE)


def _redact_uri(uri: str) -> str:
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(SECRET_PARAMS.search(k) for k, _ in pairs):
            query = urlencode([(k, MASK if SECRET_PARAMS.search(k) else v) for k, v in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return uri
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(text: Any) -> Any:
    """``text`` with the password and secret query values of every URI in it masked (non-strings unchanged)."""
    return URI.sub(lambda m: _redact_uri(m.group(0)), text) if isinstance(text, str) else text


def redact_all(data: Any) -> Any:
    """Nested plain data (dicts, lists, strings) with every string redacted."""
    if isinstance(data, dict):
        return {k: redact_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_all(v) for v in data]
    return redact(data)


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
