"""The stage results the analysis may read: the published campaign's files, each checked before use.

Where results live and how a file is checked against its provenance record are the store's
(``store.layout``, ``store.records``); here a store error becomes an ``AnalysisError``, which stops the
analysis with one line naming the file and the reason, before any output is written.
Same concept, other floor: ``pipeline/jobs/inputs.py``.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from store import layout, records
from store.layout import STAGES
from store.records import StageFile


class AnalysisError(ValueError):
    """Bad input to the analysis; the scripts print it as one line and exit 1."""


@contextmanager
def store_errors() -> Iterator[None]:
    """A store error inside the block is the analysis's bad input."""
    try:
        yield
    except layout.StoreError as err:
        raise AnalysisError(str(err)) from None


def campaign_dir(outputs_dir: str | Path, campaign: str) -> Path:
    with store_errors():
        return layout.campaign_dir(outputs_dir, campaign)


def named_campaign(params: dict, key: str) -> str:
    """The campaign params.yaml names under ``key`` (AnalysisError in one line where it names none), checked to be a
    name, never a path."""
    campaign = params.get(key)
    if not campaign:
        raise AnalysisError(f"params.yaml names no {key}: add `{key}: <campaign>`")
    campaign_dir(params["outputs_dir"], campaign)
    return str(campaign)


def require_results(outputs_dir: str | Path, campaign: str) -> None:
    """A campaign named in params.yaml must hold some result, or every table would silently be empty."""
    if not any(layout.stage_paths(outputs_dir, campaign, s) for s in STAGES):
        raise AnalysisError(f"campaign {campaign!r} has no results under {campaign_dir(outputs_dir, campaign)}; "
                            f"run `python -m pipeline.run campaign={campaign} ...` or publish another "
                            "campaign (params.yaml: campaign)")


def read_stage_files(outputs_dir: str | Path, campaign: str, stage: str) -> list[StageFile]:
    """Every finished file of a stage in a campaign, all checked (the first bad one raises)."""
    with store_errors():
        require_results(outputs_dir, campaign)
        return records.read_stage_files(outputs_dir, campaign, stage)
