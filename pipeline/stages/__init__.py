"""One module per stage. Each exposes ``SCHEMA`` (its Parquet schema) and ``run(ctx) -> StageOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

STAGES = ("timing", "acceptance", "speed", "divergence", "distribution")


@dataclass
class StageOutput:
    rows: pd.DataFrame
    metrics: dict[str, float]  # headline numbers, logged to MLflow
    summary: list[str] = field(default_factory=list)  # printed for the user
