"""The jobs the analysis pools: one row per stage file of the published campaign, from its provenance.

    python -m analysis.jobs       (checks every stage file of the campaign, writes outputs/analysis/jobs.parquet)

The report lists this table, so a reader sees which runs (config, commit, date) stand behind
the numbers, and that an ad-hoc run in another campaign is not among them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.common import load_params, published_campaign, run_script, save_table
from analysis.inputs import read_stage_files
from store.layout import STAGES

COLUMNS = ["campaign", "stage", "pair", "config_hash", "rows", "started_at", "finished_at", "git_commit", "file",
           "note"]


def job_table(outputs_dir: str | Path, campaign: str) -> pd.DataFrame:
    """Every stage file of ``campaign`` (each checked in full), in stage order, with its provenance."""
    rows = [{"campaign": campaign, "stage": stage, "pair": f.meta.get("pair"),
             "config_hash": f.meta.get("config_hash"), "rows": int(f.meta["rows"]),
             "started_at": f.meta.get("started_at"), "finished_at": f.meta.get("finished_at"),
             "git_commit": f.meta.get("git_commit"), "file": f.path.as_posix(),
             # Files stored before provenance records existed got one afterwards; it says so here.
             "note": f.meta.get("migrated")}
            for stage in STAGES for f in read_stage_files(outputs_dir, campaign, stage)]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"rows": "int64"})


def main() -> None:
    params = load_params()
    campaign = published_campaign(params)
    jobs = job_table(params["outputs_dir"], campaign)
    save_table(jobs, Path(params["analysis_dir"]) / "jobs.parquet")
    print(f"analysis.jobs: campaign {campaign!r}: {len(jobs)} jobs "
          f"({', '.join(f'{n} {s}' for s, n in jobs.stage.value_counts(sort=False).items())})")


if __name__ == "__main__":
    run_script("analysis.jobs", main)
