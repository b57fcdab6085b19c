"""Look at MLflow's compare view as a person would: headless Chromium screenshots of two speed runs
that differ in k, and a check that their metric rows carry the same names side by side.

    python -m benchmarks.mlflow_ui_check                     # logs a small 2-job k sweep (tiny models) first
    python -m benchmarks.mlflow_ui_check --uri sqlite:///mlflow.db --no-sweep   # the runs you already have
    python -m benchmarks.mlflow_ui_check --uri sqlite:///mlflow.db --runs ID,ID  # these runs (e.g. two arm runs
                                                                                 # of a llama.cpp speed job)

Needs Chromium (Debian: apt-get install chromium). Writes outputs/ui_check/compare_runs.png,
compare_arms.png and the rendered DOM; exits 1 if a metric is missing from the compare view.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
# The compare view's metric table scrolls inside a fixed-height box (alphabetical rows): a job view shows
# its first rows, an arm view (fewer metrics) shows these in full.
# The headline (speedup with its interval, alpha, tokens_per_pass, runs) comes first; the rest is x_<name>.
METRICS = {"compare_runs": ("alpha", "runs", "speedup", "speedup_hi", "speedup_lo", "tokens_per_pass"),
           "compare_arms": ("alpha", "runs", "speedup", "speedup_hi", "speedup_lo", "tokens_per_pass",
                            "x_draft_ms_per_iter", "x_plain_tokens_per_s", "x_spec_tokens_per_s")}
# Names of the old layout (k and kind inside the metric name): a staircase of empty cells when compared.
DOTTED = (">speedup_median.", ">alpha.k", ">draft_ms_per_iter.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sweep(uri: str, tmp: Path) -> None:
    subprocess.run([sys.executable, "-m", "pipeline.run", "-m", "k=2,4", "pair=tiny_random", "prompts=smoke",
                    "stage=speed", "device=cpu", "max_new_tokens=12", "stage.timing_repeats=2", "campaign=ui-check",
                    f"outputs_dir={tmp}/outputs", f"mlflow.tracking_uri={uri}", f"hydra.sweep.dir={tmp}/sweep"],
                   cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)


def select_runs(runs: list) -> list:
    """Two speed job runs that differ in k: FINISHED only (a RUNNING or failed job has no or NaN metrics), of the
    newest run's prompt set only (runs of other prompts do not compare); one per k, newest first. Exits with one
    line when fewer than two such runs exist."""
    done = [r for r in runs if r.info.status == "FINISHED"]
    if not done:
        raise SystemExit("mlflow_ui_check: no FINISHED speed run in the store; run without --no-sweep")
    def prompts_of(run) -> str:  # its prompt set (file) and kinds
        return f"{run.data.tags.get('prompt_set', '?')}: {run.data.tags.get('prompts', '?')}"

    prompts = prompts_of(done[0])  # the newest finished run's
    same = [r for r in done if prompts_of(r) == prompts]
    by_k: dict[str, object] = {}
    for run in same:
        by_k.setdefault(run.data.params.get("k", "?"), run)
    if len(by_k) < 2:
        raise SystemExit(f"mlflow_ui_check: need two FINISHED speed runs with different k on one prompt set "
                         f"({prompts!r}); found {len(by_k)}: run without --no-sweep")
    return [by_k[k] for k in sorted(by_k)[:2]]


def _pick(uri: str) -> tuple[str, list[str], list[str]]:
    """The experiment and two speed job runs that differ in k (and their pooled 'all' arm runs)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("speclab")
    jobs = client.search_runs([exp.experiment_id], "tags.stage = 'speed' and tags.level = 'stage'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    picked = [r.info.run_id for r in select_runs(jobs)]
    arms = []
    for rid in picked:
        kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{rid}' and params.kind = 'all'")
        arms += [r.info.run_id for r in kids[:1]]
    return exp.experiment_id, picked, arms


def _given(uri: str, ids: list[str]) -> tuple[str, list[str], list[str]]:
    """The experiment of the given runs; they are compared as arm runs (their metric names: METRICS["compare_arms"])."""
    import mlflow

    return mlflow.MlflowClient(uri).get_run(ids[0]).info.experiment_id, [], ids


def _shot(chromium: str, url: str, png: Path, width: int = 1400, height: int = 4000) -> str:
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--window-size={width},{height}", "--virtual-time-budget=20000"]
    subprocess.run([*common, f"--screenshot={png}", url], check=True, capture_output=True, timeout=120)
    return subprocess.run([*common, "--dump-dom", url], check=True, capture_output=True, text=True,
                          timeout=120).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default=None, help="tracking store (default: a new temporary sqlite store)")
    ap.add_argument("--no-sweep", action="store_true", help="use the runs already in --uri")
    ap.add_argument("--runs", default="", help="comma-separated run ids to compare (implies --no-sweep)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "ui_check"))
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        raise SystemExit("mlflow_ui_check: Chromium not found: apt-get install chromium")
    tmp = Path(tempfile.mkdtemp(prefix="speclab-ui-"))
    uri = args.uri or f"sqlite:///{tmp}/mlflow.db"
    if not (args.no_sweep or args.runs):
        _sweep(uri, tmp)
    exp, jobs, arms = _given(uri, args.runs.split(",")) if args.runs else _pick(uri)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missing: dict[str, list[str]] = {}
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        for name, ids in (("compare_runs", jobs), ("compare_arms", arms)):
            if not ids:
                continue
            url = (f"http://127.0.0.1:{port}/#/compare-runs?runs={quote(json.dumps(ids))}"
                   f"&experiments={quote(json.dumps([exp]))}")
            dom = _shot(chromium, url, out / f"{name}.png")
            (out / f"{name}.html").write_text(dom)
            missing[name] = [m for m in METRICS[name] if f">{m}<" not in dom] + [d for d in DOTTED if d in dom]
            print(f"{name}: {out / (name + '.png')}  runs {ids}  metrics missing from the view: {missing[name] or 'none'}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    sys.exit(1 if any(missing.values()) else 0)


if __name__ == "__main__":
    main()
