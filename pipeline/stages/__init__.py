"""One module per stage (timing, acceptance, speed, divergence, distribution, batch, plan). Each exposes ``SCHEMA``
(its Parquet schema), ``run(ctx) -> StageOutput`` (``pipeline.jobs.stage_output``), ``summarize(rows, cfg) -> StageOutput`` (the headline numbers of a
result, also used to log a run from its file) and ``describe(cfg) -> str`` (its run's name). The top floor under the
entry points (pipeline.run, recheck, workload): may import every floor of pipeline/ below it."""
from __future__ import annotations

import importlib
from types import ModuleType


def stage_module(part: str) -> ModuleType:
    """A stage's module by its name (``speed`` -> ``pipeline.stages.speed``): the entry point hands this to the jobs
    floor, which runs stages without importing them."""
    return importlib.import_module(f"pipeline.stages.{part}")
