"""Look at MLflow as a person would: headless Chromium screenshots of the experiment's first page (its runs, with
their headline metrics) and of the compare view of three speed runs that differ in k, and a check that their
metric rows carry the same names side by side.

    python -m benchmarks.mlflow_ui_check                     # logs a small 3-job k sweep (tiny models) first
    python -m benchmarks.mlflow_ui_check --uri sqlite:///mlflow.db --no-sweep   # the runs you already have
    python -m benchmarks.mlflow_ui_check --uri sqlite:///mlflow.db --runs ID,ID  # these runs (e.g. two arm runs
                                                                                 # of a llama.cpp speed job)

Needs Chromium (Debian: apt-get install chromium), driven over its DevTools protocol on 127.0.0.1. The browser
starts as a person's would after two clicks: 'Model training' (MLflow 3 opens experiments on GenAI) and Columns
with the headline metrics and the trust tag (the UI shows no metric column until one is picked; MLflow keeps
the choice in the browser). Writes outputs/ui_check/experiment_runs.png, compare_runs.png, compare_arms.png and
the rendered DOM; exits 1 if a metric is missing from a view.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
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

from pipeline.tracking.mlflow_view import RUNS_VIEW_QUERY

ROOT = Path(__file__).resolve().parents[1]
# The compare view's metric table scrolls inside a fixed-height box of about seven rows (alphabetical): the
# headline (speedup with its interval, alpha, tokens_per_pass, runs) and trusted fill it; the rest is x_<name>.
METRICS = {"compare_runs": ("alpha", "runs", "speedup", "speedup_hi", "speedup_lo", "tokens_per_pass", "trusted"),
           "compare_arms": ("alpha", "runs", "speedup", "speedup_hi", "speedup_lo", "tokens_per_pass",
                            "x_draft_ms_per_iter", "x_plain_tokens_per_s", "x_spec_tokens_per_s"),
           "experiment_runs": ("speedup", "speedup_lo", "speedup_hi", "alpha")}
# Names of the old layout (k and kind inside the metric name): a staircase of empty cells when compared.
DOTTED = (">speedup_median.", ">alpha.k", ">draft_ms_per_iter.")
# The run table's columns a person picks once (Columns): the headline, the sweep's own and the trust tag.
COLUMNS = [*(f"metrics.`{m}`" for m in ("speedup", "speedup_lo", "speedup_hi", "alpha", "tokens_per_pass", "runs",
                                        "sweep_jobs", "sweep_trusted_jobs", "sweep_best_job")), "tags.`trust`"]
K_SWEEP = "2,4,6"
WIDTH = 1700  # the screenshots' width in CSS pixels


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sweep(uri: str, tmp: Path) -> None:
    """A 3-job k sweep on tiny models, two rounds of three prompts: six runs in each pooled arm, an interval."""
    subprocess.run([sys.executable, "-m", "pipeline.run", "-m", f"k={K_SWEEP}", "pair=tiny_random", "prompts=smoke",
                    "stage=speed", "device=cpu", "max_new_tokens=12", "stage.timing_repeats=2",
                    "stage.timing_warmup=0", "stage.rounds=2", "campaign=ui-check",
                    f"outputs_dir={tmp}/outputs", f"mlflow.tracking_uri={uri}", f"hydra.sweep.dir={tmp}/sweep"],
                   cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)


def select_runs(runs: list, n: int = 3) -> list:
    """Up to ``n`` (at least two) speed job runs that differ in k, in k's order: FINISHED only (a RUNNING or failed
    job has no or NaN metrics), of the newest run's prompt set only (runs of other prompts do not compare); one per
    k, newest first. Exits with one line when fewer than two such runs exist."""
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
    return [by_k[k] for k in sorted(by_k, key=lambda k: int(k) if k.isdigit() else 0)[:n]]


def _pick(uri: str) -> tuple[str, list[str], list[str]]:
    """The experiment and three speed job runs that differ in k (and their pooled 'all' arm runs)."""
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


class Browser:
    """Headless Chromium on a DevTools port of 127.0.0.1: one page, driven by ``call`` (DevTools protocol)."""

    def __init__(self, chromium: str, profile: Path, width: int, height: int) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                      f"--remote-debugging-port={self.port}", "--remote-debugging-address=127.0.0.1",
                                      f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws, self.session, self.n = None, None, 0

    async def __aenter__(self) -> Browser:
        import aiohttp  # an MLflow dependency

        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.2)
        else:
            raise SystemExit("mlflow_ui_check: Chromium did not open its DevTools port")
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.call("Page.enable")
        return self

    async def __aexit__(self, *exc) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    async def call(self, method: str, **params) -> dict:
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 60)
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str):
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return res.get("result", {}).get("value")

    async def goto(self, url: str, ready: str, height: int, settle: float = 2.0) -> str:
        """Open ``url`` afresh (the app reads its settings as it starts) in a ``WIDTH`` x ``height`` page and wait
        (up to 60 s) until the page's text holds ``ready``, then ``settle`` seconds more for late rows; the DOM."""
        await self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1,
                        mobile=False)
        await self.call("Page.navigate", url="about:blank")
        await self.call("Page.navigate", url=url)
        for _ in range(120):
            await asyncio.sleep(0.5)
            if ready in (await self.js("document.body ? document.body.innerText : ''") or ""):
                break
        await asyncio.sleep(settle)
        return await self.js("document.documentElement.outerHTML") or ""

    async def shot(self, png: Path) -> None:
        png.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))


def ui_state(experiment: str, expanded: list[str]) -> dict[str, str]:
    """The browser's MLflow settings of a person who opened the runs view, closed the assistant, picked the
    headline columns (``COLUMNS``) and expanded the sweeps (``expanded``: their run ids)."""
    page = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
            "selectedColumns": COLUMNS, "columnOrder": [], "columnWidths": {"attributes.`Run Name`": 420},
            "runsExpanded": {r: True for r in expanded}, "runsPinned": [], "runsHidden": [], "runsVisibilityMap": {},
            "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
            "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
            "groupBy": None, "groupsExpanded": {}, "autoRefreshEnabled": False}
    return {f'MLflowLocalStorage-1.1-ExperimentPage-["{experiment}"]-ReactComponentState': json.dumps(page),
            "mlflow.assistant.panelOpen_v1": "false", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}


async def _views(chromium: str, base: str, exp: str, views: list[tuple[str, str, str, int]], expanded: list[str],
                 out: Path, profile: Path) -> dict[str, str]:
    """Screenshot each (name, url, text it waits for, page height) of ``views``; their DOMs by name."""
    doms = {}
    async with Browser(chromium, profile, WIDTH, 900) as b:
        await b.goto(base + "/", "", 900)
        for key, value in ui_state(exp, expanded).items():
            await b.js(f"localStorage.setItem({json.dumps(key)}, {json.dumps(value)})")
        for name, url, ready, height in views:
            doms[name] = await b.goto(url, ready, height)
            await b.shot(out / f"{name}.png")
    return doms


def _stop(server: subprocess.Popen) -> None:
    """End the MLflow server this script started and its workers (its process group, by the server's id)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
            server.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missing: dict[str, list[str]] = {}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # Its own process group: the server's workers end with it (_stop), whatever way this ends.
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        import mlflow

        sweeps = [r.info.run_id for r in mlflow.MlflowClient(uri).search_runs(
            [exp], "tags.level = 'sweep'", order_by=["attributes.start_time DESC"], max_results=3)]
        views = [("experiment_runs", f"{base}/#/experiments/{exp}{RUNS_VIEW_QUERY}", "speedup", 700)]
        for name, ids in (("compare_runs", jobs), ("compare_arms", arms)):
            if ids:  # tall: the compare page's tables come after its plot
                views.append((name, f"{base}/#/compare-runs?runs={quote(json.dumps(ids))}"
                                    f"&experiments={quote(json.dumps([exp]))}", "speedup", 2350))
        doms = asyncio.run(_views(chromium, base, exp, views, sweeps[:1], out, tmp / "chromium"))
        for name, dom in doms.items():
            (out / f"{name}.html").write_text(dom)
            missing[name] = [m for m in METRICS[name] if f">{m}<" not in dom] + [d for d in DOTTED if d in dom]
            print(f"{name}: {out / (name + '.png')}  metrics missing from the view: {missing[name] or 'none'}")
    finally:
        _stop(server)
    sys.exit(1 if any(missing.values()) else 0)


if __name__ == "__main__":
    main()
