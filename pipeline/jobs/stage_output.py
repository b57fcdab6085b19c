"""What a stage returns: its rows, the job's headline metrics, the lines printed for the user, and one result per
compared arm (logged as child runs); with the per-kind grouping the stages share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass
class ArmResult:
    """One compared configuration inside a job (e.g. speculative k = 4 on code), logged as a child run.

    Metric names are the same for every arm (``speedup``, ``alpha``, ...) and what tells arms apart
    (k, kind, drafter, policy, sampling) is in ``params``, so runs line up in MLflow's compare view.
    """

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    label: str = ""  # the configuration in a reader's words (``draft model k=4``), for the job's closing verdict


@dataclass
class StageOutput:
    rows: pd.DataFrame
    metrics: dict[str, float]  # job-level headline numbers, logged on the job's run
    summary: list[str] = field(default_factory=list)  # printed for the user, the run's description
    arms: list[ArmResult] = field(default_factory=list)


def by_kind(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each prompt kind's rows, and all of them as kind 'all' when there is more than one kind."""
    groups = [(str(kind), sub) for kind, sub in df.groupby("kind", sort=False)]
    return groups + ([("all", df)] if len(groups) > 1 else [])


def single_arm_metrics(arms: list[ArmResult]) -> dict[str, float]:
    """A job that compares one configuration also carries its numbers on the job run itself."""
    return dict(arms[0].metrics) if len(arms) == 1 else {}
