"""The stage results the analysis may read: the published campaign's files, each checked before use.

Results live in ``outputs/campaigns/<campaign>/<stage>/<pair>-<config hash>.parquet``, each with the
provenance record the pipeline writes (``pipeline.parquet``). A file that does not read in full, has
no record, or whose record does not match where it lies stops the analysis with an
``AnalysisError`` naming the file and the reason, before any output is written.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipeline.parquet import META_KEY

STAGE_NAMES = ("timing", "acceptance", "speed", "divergence", "distribution", "batch", "plan")
# The pipeline's rule for a campaign name (pipeline/config_schema.py): it is one folder, never a path.
CAMPAIGN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class AnalysisError(ValueError):
    """Bad input to the analysis; the scripts print it as one line and exit 1."""


@dataclass(frozen=True)
class StageFile:
    path: Path
    meta: dict
    data: pd.DataFrame


def campaign_dir(outputs_dir: str | Path, campaign: str) -> Path:
    if not isinstance(campaign, str) or not CAMPAIGN_NAME.match(campaign):
        raise AnalysisError(f"campaign {campaign!r} in params.yaml is not a campaign name "
                            "(letters, digits, '_', '.', '-')")
    return Path(outputs_dir) / "campaigns" / campaign


def stage_paths(outputs_dir: str | Path, campaign: str, stage: str) -> list[Path]:
    """The finished files of a stage in a campaign (dot files are running jobs' temp files)."""
    if stage not in STAGE_NAMES:
        raise ValueError(f"unknown stage {stage!r}: allowed are {list(STAGE_NAMES)}")
    folder = campaign_dir(outputs_dir, campaign) / stage
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))


def require_results(outputs_dir: str | Path, campaign: str) -> None:
    """A campaign named in params.yaml must hold some result, or every table would silently be empty."""
    if not any(stage_paths(outputs_dir, campaign, s) for s in STAGE_NAMES):
        raise AnalysisError(f"campaign {campaign!r} has no results under {campaign_dir(outputs_dir, campaign)}; "
                            f"run `python -m pipeline.run campaign={campaign} ...` or publish another "
                            "campaign (params.yaml: campaign)")


def _problem(pf: pq.ParquetFile, meta: dict, path: Path, stage: str, campaign: str) -> str | None:
    """Why a readable file's provenance does not fit where it lies (None when it fits)."""
    if meta.get("stage") != stage:
        return f"was written by stage {meta.get('stage')!r}, not {stage!r}"
    if meta.get("campaign") != campaign:
        return f"belongs to campaign {meta.get('campaign')!r}, not {campaign!r}"
    if path.stem != f"{meta.get('pair')}-{meta.get('config_hash')}":
        return f"does not match its provenance record (pair {meta.get('pair')!r}, config {meta.get('config_hash')!r})"
    if pf.metadata.num_rows != meta.get("rows") or not pf.metadata.num_rows:
        return f"holds {pf.metadata.num_rows} rows where {meta.get('rows')} were written"
    return None


def read_stage_file(path: Path, stage: str, campaign: str) -> StageFile:
    """One stage file, read in full and checked against its provenance record."""
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - any reader error means the same thing here
        raise AnalysisError(f"{path} is not a readable Parquet file ({type(err).__name__})") from None
    raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if not raw:
        raise AnalysisError(f"{path} carries no speclab provenance record (not a stage result)")
    try:
        meta = json.loads(raw)
    except ValueError:
        raise AnalysisError(f"{path} has a damaged provenance record") from None
    problem = _problem(pf, meta, path, stage, campaign)
    if problem:
        raise AnalysisError(f"{path} {problem}")
    try:
        table = pf.read()  # the footer can be intact while a column chunk is not
    except Exception as err:  # noqa: BLE001
        raise AnalysisError(f"{path} has data that does not read ({type(err).__name__})") from None
    return StageFile(path, meta, table.to_pandas())


def read_stage_files(outputs_dir: str | Path, campaign: str, stage: str) -> list[StageFile]:
    """Every finished file of a stage in a campaign, all checked (the first bad one raises)."""
    require_results(outputs_dir, campaign)
    return [read_stage_file(p, stage, campaign) for p in stage_paths(outputs_dir, campaign, stage)]
