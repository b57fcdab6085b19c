"""What a job reports when it ends, and the one table a multirun ends with."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.jobs.verdict import KindVerdict, fastest_per_kind
from pipeline.tracking.redact import redact

RECORD = "speclab_job.json"  # written by each job into its Hydra output folder
# The numbers a summary row shows, in order of preference, when the stage logged them.
HEADLINE = ("speedup", "alpha", "identical_share", "c_draft", "plain_tokens_per_s", "no_power_contexts",
            "predicted_speedup_all")


def headline(metrics: dict[str, float], n: int = 2) -> str:
    picked = [(k, metrics[k]) for k in HEADLINE if k in metrics and metrics[k] == metrics[k]][:n]
    return ", ".join(f"{k} {v:.3g}" for k, v in picked)


def write_job_record(folder: Path, record: dict[str, Any]) -> None:
    from store.files import atomic_write_text

    atomic_write_text(folder / RECORD, json.dumps(record, indent=1, default=str))


# A job's measuring effort, summed over a sweep on its MLflow run (sweep_metrics): blocks of adjacent runs and the
# minutes its timed runs took (speed jobs).
SWEEP_METRICS = ("blocks", "minutes")
# A job's headline, kept in its record: its job run shows them, and its sweep's run shows its fastest job's (under
# the same names, so one column of MLflow's run table reads down sweeps and jobs alike).
JOB_METRICS = ("speedup", "speedup_lo", "speedup_hi", "alpha", "tokens_per_pass")


def job_metrics(records: list[dict]) -> dict[str, float]:
    """A job run's metrics: the headline of its first stage that has one, rounded for display."""
    from pipeline.tracking.mlflow_view import rounded

    first = next((r for r in records if any(r.get(k) == r.get(k) and r.get(k) is not None for k in JOB_METRICS)), {})
    return {k: rounded(float(first[k])) for k in JOB_METRICS if first.get(k) is not None and first[k] == first[k]}


def sweep_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The sweep run's metrics: its jobs and trusted jobs (``sweep_jobs``, ``sweep_trusted_jobs``: listed after the
    headline), the blocks and minutes of the jobs that report them, and its fastest job's headline
    (``JOB_METRICS``, rounded) with that job's number (``sweep_best_job``)."""
    from pipeline.tracking.mlflow_view import rounded

    out = {"sweep_jobs": float(table.job.nunique()) if len(table) else 0.0}
    if "trust" in table and len(table):
        out["sweep_trusted_jobs"] = float(table[table.trust == "ok"].job.nunique())
    for k in SWEEP_METRICS:
        if k in table and table[k].notna().any():
            out[k] = rounded(float(table[k].sum()))
    if "speedup" in table and table.speedup.notna().any():
        best = table.loc[table.speedup.idxmax()]
        out["sweep_best_job"] = float(best.job)
        out.update({k: rounded(float(best[k])) for k in JOB_METRICS if k in best and best[k] == best[k]})
    return out


def best_per_kind(verdicts: list[dict]) -> list[str]:
    """A sweep's answer: per kind, the fastest configuration over every job's verdict (``as_records`` of
    pipeline/jobs/verdict.py, with the job and its trust), with its interval, verdict, job and trust."""
    lines = []
    for kind, v in fastest_per_kind(verdicts, lambda v: v["kind"], lambda v: v["speedup"]).items():
        text = KindVerdict(**{k: v[k] for k in KindVerdict.__dataclass_fields__}).text(f" in job {v['job']}")
        trust = "" if v["trust"] in ("ok", "-") else f", NOT TRUSTED ({v['trust']})"
        lines.append(f"best for {kind}: {text}{trust}")
    return lines


def multirun_summary(sweep_dir: Path, tracker: Any = None, parent: str | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Read every job's record under ``sweep_dir``, log one table across the jobs and where to see them."""
    rows, verdicts = [], []
    for path in sorted(sweep_dir.glob(f"*/{RECORD}"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0):
        record = json.loads(path.read_text())
        for part in record["parts"]:
            rows.append({"job": record["job"], "stage": part["stage"], "status": part["status"],
                         "trust": part.get("trust") or "-", "overrides": record["overrides"],
                         "headline": part["headline"], "file": part["file"],
                         **{k: part.get(k, float("nan")) for k in (*SWEEP_METRICS, *JOB_METRICS)}})
            verdicts += [{**v, "job": record["job"], "trust": part.get("trust") or "-"} for v in part.get("verdicts") or []]
    table = pd.DataFrame(rows, columns=["job", "stage", "status", "trust", "overrides", "headline", "file",
                                        *SWEEP_METRICS, *JOB_METRICS])
    # The overrides every job shares say nothing about a row: keep what the sweep varied.
    common = set.intersection(*(set(o.split()) for o in table.overrides)) if len(table) else set()
    table["overrides"] = [" ".join(t for t in o.split() if t not in common) for o in table.overrides]
    lines = [f"multirun of {table.job.nunique()} jobs in {sweep_dir}:"]
    if len(table):
        lines += table.drop(columns=["file", *SWEEP_METRICS, *JOB_METRICS]).to_markdown(index=False).splitlines()
        counts = table.status.value_counts().to_dict()
        lines.append("status: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        untrusted = table[~table.trust.isin(["ok", "-"])]
        if len(untrusted):
            lines.append(f"NOT TRUSTED: jobs {', '.join(str(j) for j in untrusted.job.unique())} "
                         f"({', '.join(sorted(set(untrusted.trust)))}): their numbers above may be wrong; rerun them "
                         "on a quiet machine")
        lines += best_per_kind(verdicts)
    if tracker is not None and parent is not None:
        lines.append(f"MLflow: experiment {tracker.experiment!r} at {redact(tracker.uri)}, parent run {parent} (its child runs "
                     "are the jobs; a speed job's children are its arms). Browse with "
                     "`MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --workers 1`, choose 'Model training' at the "
                     "top left (MLflow 3 opens on GenAI) and open the parent run.")
    else:
        lines.append("MLflow: not logged (tracking off or unreachable); the Parquet files above hold the results")
    print("\n".join(lines), flush=True)  # the multirun's closing report, after Hydra's own lines
    return table, lines
