"""The latest plan: per pair, the plan job whose provenance record says it finished last.

A campaign may hold several plans (one remade after a change); a speed job's recommended arm follows the
latest one of its pair (the pipeline asks for its file), the analysis reports and checks the same one
(from rows that carry their job's ``finished_at``), and, asked for no campaign, shows the campaign whose
plan finished last.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from store.layout import campaigns, stage_paths
from store.records import read_meta


def _finished(path: Path) -> str:
    return str(read_meta(path).get("finished_at", ""))


def _engine(path: Path) -> str:
    """The engine a plan file was made for (files written before engines: speclab's loop)."""
    import pyarrow.parquet as pq

    if "engine" not in pq.read_schema(path).names:
        return "speclab"
    engines = pd.read_parquet(path, columns=["engine"]).engine.unique()
    return str(engines[0]) if len(engines) else "speclab"


def latest_plan_file(outputs_dir: str | Path, campaign: str, pair: str, engine: str = "speclab") -> Path | None:
    """``pair``'s plan file for ``engine`` in ``campaign`` that finished last (None: the campaign has no such plan):
    a plan names one engine's settings, so a llama.cpp job never follows speclab's plan or the other way round."""
    files = sorted((p for p in stage_paths(outputs_dir, campaign, "plan", pair) if _engine(p) == engine), key=_finished)
    return files[-1] if files else None


def latest_plan_campaign(outputs_dir: str | Path) -> str | None:
    """The campaign whose plan finished last (None: no campaign holds a plan)."""
    found = [(_finished(path), name) for name in campaigns(outputs_dir)
             for path in stage_paths(outputs_dir, name, "plan")]
    return max(found)[1] if found else None


def latest_plan(plan: pd.DataFrame) -> pd.DataFrame:
    """Of plan rows carrying their job's ``finished_at`` (and ``pair``, ``config_hash``), those of each
    pair's plan job that finished last."""
    last = plan.sort_values("finished_at").groupby("pair").config_hash.transform("last")
    return plan[plan.config_hash == last.reindex(plan.index)]
