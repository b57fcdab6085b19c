"""MLflow from the analysis: optional, fail-soft and quick to give up.

The tracking store is a side channel: the Parquet tables, figures, metrics and report are the
record, and nothing written here is a DVC output. Settings come from params.yaml:

    mlflow:
      enabled: true                    # false: never contact the store
      tracking_uri: ...                # optional: the pipeline's store (store/shared_defaults.py) without it
      experiment: ...                  # optional, likewise

An http(s) store is probed with a 3-second socket connection before any MLflow call, and MLflow's
own HTTP retries are switched off while the analysis talks to it, so an unreachable server costs
at most a few seconds and one line of output.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from store.mlflow_probe import first_line, unreachable  # noqa: F401 - the analysis's own names
from store.mlflow_probe import quick_http as _quick_http
from store.shared_defaults import EXPERIMENT, TRACKING_URI

# Logging figures and tables takes longer than a probe: a longer timeout, still no retry loop.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# MLflow's own "View run ... at: URL" line would print params.yaml's tracking URI with its credentials.
os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def quick_http():
    """No retries and a 10 s timeout for MLflow's HTTP calls while the analysis logs."""
    return _quick_http(HTTP_ENV)


@dataclass(frozen=True)
class Tracking:
    enabled: bool
    uri: str
    experiment: str


def tracking_settings(params: dict) -> Tracking:
    """params.yaml's ``mlflow:`` section (defaults: enabled, and the pipeline's store and experiment)."""
    cfg = params.get("mlflow") or {}
    return Tracking(enabled=bool(cfg.get("enabled", True)), uri=str(cfg.get("tracking_uri", TRACKING_URI)),
                    experiment=str(cfg.get("experiment", EXPERIMENT)))
