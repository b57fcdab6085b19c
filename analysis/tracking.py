"""MLflow from the analysis: optional, fail-soft and quick to give up.

The tracking store is a side channel: the Parquet tables, figures, metrics and report are the
record, and nothing written here is a DVC output. Settings come from params.yaml:

    mlflow:
      enabled: true                    # false: never contact the store
      tracking_uri: sqlite:///mlflow.db
      experiment: speclab

An http(s) store is probed with a 3-second socket connection before any MLflow call, and MLflow's
own HTTP retries are switched off while the analysis talks to it, so an unreachable server costs
at most a few seconds and one line of output.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass(frozen=True)
class Tracking:
    enabled: bool
    uri: str
    experiment: str


def tracking_settings(params: dict) -> Tracking:
    """params.yaml's ``mlflow:`` section (defaults: enabled, sqlite:///mlflow.db, experiment speclab)."""
    cfg = params.get("mlflow") or {}
    return Tracking(enabled=bool(cfg.get("enabled", True)), uri=str(cfg.get("tracking_uri", "sqlite:///mlflow.db")),
                    experiment=str(cfg.get("experiment", "speclab")))


def unreachable(uri: str) -> str | None:
    """Why the store at ``uri`` cannot be used (None when it looks usable); at most PROBE_TIMEOUT_S seconds."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname or "localhost", port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as err:
            return f"{uri} is not reachable ({type(err).__name__})"
    elif parsed.scheme == "sqlite":
        db = uri.removeprefix("sqlite:///")
        if db and db != ":memory:" and not Path(db).parent.is_dir():
            return f"{uri}: folder {Path(db).parent} does not exist"
    return None


@contextmanager
def quick_http() -> Iterator[None]:
    """No retries and a short timeout for MLflow's HTTP calls; the previous settings come back afterwards."""
    saved = {k: os.environ.get(k) for k in HTTP_ENV}
    os.environ.update(HTTP_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested parameters as dotted keys (``drift.max_ratio``), leaves unchanged."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
