"""Defaults the pipeline and the analysis share, defined once: both read them from here.

The analysis's own knobs in params.yaml may still set another value; without one it takes these.
"""
from __future__ import annotations

# Before/after step times of one job differing by more than this factor flag it as drifted: the job-time
# check (trust.max_drift) and the analysis's flag (params.yaml drift.max_ratio, which tests keep equal).
DRIFT_LIMIT = 1.25

# The MLflow tracking store (relative to the directory a job or the analysis runs from: the repo root).
TRACKING_URI = "sqlite:///mlflow.db"
EXPERIMENT = "speclab"
