"""Where results live: ``<outputs>/campaigns/<campaign>/<stage>/<pair>-<config hash>.parquet``.

A campaign is one folder (ad-hoc runs in ``scratch``, published results in the campaign params.yaml names),
so its name, like a pair's, is one path component, never a path.
"""
from __future__ import annotations

import re
from pathlib import Path

STAGES = ("timing", "acceptance", "speed", "divergence", "distribution", "batch", "plan", "load")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a campaign or pair name
NAME_RULE = "letters, digits, '_', '.', '-' (up to 64 characters, no '/')"


class StoreError(ValueError):
    """A store input that is not what it should be; the message is one line naming it and why."""


def campaign_dir(outputs_dir: str | Path, campaign: str) -> Path:
    if not isinstance(campaign, str) or not NAME.match(campaign):
        raise StoreError(f"campaign {campaign!r} is not a campaign name ({NAME_RULE})")
    return Path(outputs_dir) / "campaigns" / campaign


def stage_dir(outputs_dir: str | Path, campaign: str, stage: str) -> Path:
    if stage not in STAGES:
        raise StoreError(f"unknown stage {stage!r}: allowed are {list(STAGES)}")
    return campaign_dir(outputs_dir, campaign) / stage


def stage_file(outputs_dir: str | Path, campaign: str, stage: str, pair: str, config_hash: str) -> Path:
    """The file a job of ``config_hash`` on ``pair`` writes for ``stage``."""
    return stage_dir(outputs_dir, campaign, stage) / f"{pair}-{config_hash}.parquet"


def stage_paths(outputs_dir: str | Path, campaign: str, stage: str, pair: str | None = None) -> list[Path]:
    """The finished files of a stage in a campaign (of one pair when given), by name; dot files are running
    jobs' temporary files."""
    pattern = f"{pair}-*.parquet" if pair is not None else "*.parquet"
    return sorted(p for p in stage_dir(outputs_dir, campaign, stage).glob(pattern) if not p.name.startswith("."))


def campaigns(outputs_dir: str | Path) -> list[str]:
    """The campaigns under ``outputs_dir``, by name."""
    return sorted(p.name for p in (Path(outputs_dir) / "campaigns").glob("*") if p.is_dir() and NAME.match(p.name))
