"""After the cluster test's sweep: every stage file complete, every MLflow run ended, the cancelled job's KILLED.

    python cluster/check.py OUTPUTS_DIR CAMPAIGN TRACKING_URI JOBS
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import mlflow

from analysis.common import read_stage


def main(outputs: str, campaign: str, uri: str, jobs: int) -> list[str]:
    problems = []
    speed = read_stage(outputs, "speed", campaign)  # every file checked against its record and hash
    files = sorted((Path(outputs) / "campaigns" / campaign / "speed").glob("*"))
    if len([f for f in files if f.suffix == ".parquet"]) != jobs or len(files) != jobs:
        problems.append(f"{len(files)} files in the campaign's speed folder, {jobs} expected: {[f.name for f in files]}")
    if speed.config_hash.nunique() != jobs:
        problems.append(f"{speed.config_hash.nunique()} jobs in the Parquet rows, {jobs} expected")
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("speclab")
    runs = client.search_runs([exp.experiment_id], f"tags.campaign = '{campaign}'", max_results=5000)
    kinds = Counter((r.data.tags.get("level"), r.info.status) for r in runs)
    if any(r.info.status == "RUNNING" for r in runs):
        problems.append(f"runs left RUNNING: {kinds}")
    if kinds[("stage", "KILLED")] != 1 or kinds[("stage", "FINISHED")] != jobs:
        problems.append(f"expected 1 KILLED and {jobs} FINISHED job runs: {kinds}")
    if kinds[("sweep", "FAILED")] != 1 or kinds[("sweep", "FINISHED")] != 1:
        problems.append(f"expected the cancelled sweep FAILED and its rerun FINISHED: {kinds}")
    ids = {level: {r.info.run_id for r in runs if r.data.tags.get("level") == level} for level in ("sweep", "stage")}
    for level, parent in (("stage", "sweep"), ("arm", "stage")):
        orphans = [r.info.run_id for r in runs if r.data.tags.get("level") == level
                   and r.data.tags.get("mlflow.parentRunId") not in ids[parent]]
        if orphans:
            problems.append(f"{level} runs whose parent is no {parent} run of the campaign: {orphans}")
    print(f"cluster check: {len(files)} stage files, MLflow runs {dict(kinds)}")
    return problems


if __name__ == "__main__":
    found = main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
    for line in found:
        print(f"cluster check: {line}", file=sys.stderr)
    sys.exit(1 if found else 0)
