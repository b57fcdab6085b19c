"""`dvc metrics` and `dvc plots` work on a fresh copy of the repository (dvc.yaml's code deps: test_stage_deps.py).

The copy is what a clone would hold (tracked and not ignored files, one commit); the metrics and
plot files are committed results, so no `dvc repro` is needed to show or diff them. `dvc metrics show` is one
short table (a row per campaign, the detail in outputs/metrics/detail/), and `dvc plots show` writes a page that
renders with no network (its vega scripts inlined: analysis.plot_page; drawn in Chromium: benchmarks.dvc_plots_check).
"""
from __future__ import annotations

import configparser
import csv
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from analysis import plot_page
from analysis.answer import CAMPAIGN_KEYS
from analysis.engines import METRICS_KEY
from analysis.load import METRICS_KEY as LOAD_KEY
from benchmarks.dvc_plots_check import html_id, network_loads
from test_dvc_safety import BIN, REPO, copy_repository, run

DECLARED_PLOTS = {"speedup_by_k", "speedup_predicted_vs_measured", "alpha_by_k", "step_time_vs_pass_length",
                  "time_model_predicted_vs_measured"}

needs_dvc = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")
needs_chromium = pytest.mark.skipif(not shutil.which("chromium"), reason="Chromium is not installed")
WIDTH = 200  # a terminal's columns `dvc metrics show` may take
DETAIL = ("answer", "batch", "engines", "headline", "load", "planner", "spec_bench", "time_model", "trees")


def declared_metrics(spec: dict) -> list[str]:
    return [path for stage in spec["stages"].values() for entry in stage.get("metrics", []) for path in entry]


def table_width(files: dict[str, dict]) -> int:
    """The widest line `dvc metrics show` prints for these files, or more: a column per key (dotted for nested
    keys) as wide as its header or widest value, and 4 spaces between columns (DVC puts 2 to 4)."""
    columns: dict[str, int] = {"Path": max(len("Path"), *map(len, files))}
    for data in files.values():
        for key, value in data.items():
            columns[key] = max(columns.get(key, 0), len(key), len(str(value)))
    return sum(w + 4 for w in columns.values()) - 4


def test_metrics_show_is_one_short_table():
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    declared = declared_metrics(spec)
    # a row per campaign of the answer, and the engines line's (analysis.engines)
    assert sorted(declared) == sorted(f"outputs/metrics/{key}.json" for key in (*CAMPAIGN_KEYS, METRICS_KEY, LOAD_KEY))
    files = {path: json.loads((REPO / path).read_text()) for path in declared}
    for path, data in files.items():
        assert not any(isinstance(v, (dict, list)) for v in data.values()), f"{path}: one row, no nested keys"
        assert len(data) <= 10, f"{path}: {len(data)} columns"
        assert {"campaign", "answers", "speculate", "speedup_max"} <= set(data), path
    assert table_width(files) <= WIDTH, table_width(files)
    # the detail is still written, as plain outputs (`dvc metrics show outputs/metrics/detail/x.json` reads it)
    outs = {path for stage in spec["stages"].values() for entry in stage.get("outs", []) for path in entry}
    for name in DETAIL:
        assert f"outputs/metrics/detail/{name}.json" in outs
        assert (REPO / "outputs" / "metrics" / "detail" / f"{name}.json").is_file()
    assert not [name for name in DETAIL if (REPO / "outputs" / "metrics" / f"{name}.json").exists()]


def test_the_width_estimate_catches_a_wide_table():
    """What the table test guards against: the old metrics (one file, a column per pair, kind and number)."""
    detail = json.loads((REPO / "outputs" / "metrics" / "detail" / "headline.json").read_text())
    flat = {f"{pair}.{group}.{kind}": v for pair, groups in detail.items() if isinstance(groups, dict)
            for group, kinds in groups.items() for kind, v in kinds.items()}
    assert table_width({"outputs/metrics/headline.json": flat}) > WIDTH


def page_path() -> Path:
    """The page .dvc/config names as plots.html_template (a path relative to .dvc/, as DVC reads it)."""
    config = configparser.ConfigParser()
    config.read(REPO / ".dvc" / "config")
    return (REPO / ".dvc" / config["plots"]["html_template"]).resolve()


def test_dvc_plots_page_carries_its_own_vega_and_loads_nothing():
    page = page_path()
    assert page == plot_page.PAGE and page.is_file()
    html = page.read_text(encoding="utf-8")
    assert "{plot_divs}" in html
    assert "{scripts}" not in html  # where DVC would put its <script src="https://cdn.jsdelivr.net/..."> tags
    assert network_loads(html) == []
    bundle = plot_page.bundle_of(html)
    assert hashlib.sha256(bundle.encode()).hexdigest() == plot_page.BUNDLE_SHA256
    for name in ("window.vega=", "window.vegaLite=", "window.vegaEmbed="):
        assert name in bundle, name
    assert len(html.encode()) < 2_000_000


def test_dvc_fills_the_page_without_network_scripts(tmp_path):
    """DVC's renderer (dvc_render, what `dvc plots show` calls) with the page: the plot's div, no CDN tag."""
    from dvc_render.html import render_html
    from dvc_render.vega import VegaRenderer

    renderer = VegaRenderer([{"k": 1, "alpha": 0.5, "series": "all", "rev": "workspace"}], "alpha_by_k",
                            template=str(REPO / "analysis" / "plot_templates" / "lines_by_series.json"),
                            x="k", y="alpha")
    out = render_html([renderer], tmp_path / "index.html", html_template=str(page_path()))
    html = out.read_text(encoding="utf-8")
    assert f'<div id = "{html_id("alpha_by_k")}">' in html and "vegaEmbed('#alpha_by_k'" in html
    assert "cdn.jsdelivr.net" not in html and network_loads(html) == []


def test_the_network_check_catches_dvcs_own_page():
    from dvc_render.vega import VegaRenderer

    assert len(network_loads(VegaRenderer.SCRIPTS)) == 3
    assert network_loads('<link rel="stylesheet" href="//example.org/a.css">') != []
    assert network_loads('<a href="https://vega.github.io/editor/">open</a><script>"https://x"</script>') == []


def test_fit_strategies_headline_read_the_drift_table():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("fit", "strategies", "headline"):
        assert "outputs/analysis/drift.parquet" in stages[name]["deps"]
        assert "drift_table(" not in (REPO / "analysis" / f"{name}.py").read_text()


def test_declared_plot_files_have_the_declared_fields():
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    for entry in spec["plots"]:
        for plot_id, props in (entry.items() if isinstance(entry, dict) else [(entry, None)]):
            if props is None:
                assert (REPO / plot_id).is_dir()
                continue
            assert (REPO / props["template"]).is_file(), props["template"]
            for path, field in props["y"].items():
                with open(REPO / path, newline="") as f:
                    header = next(csv.reader(f))
                assert {props["x"], field, "series"} <= set(header), (plot_id, header)


@pytest.mark.slow
@needs_dvc
def test_metrics_and_plots_show_and_diff_in_a_fresh_copy(tmp_path):
    repo = tmp_path / "repo"
    copy_repository(repo)

    table = run(["dvc", "metrics", "show"], repo)
    assert table.returncode == 0, table.stderr
    assert 0 < max(map(len, table.stdout.splitlines())) <= WIDTH, table.stdout
    shown = run(["dvc", "metrics", "show", "--json"], repo)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)[""]["data"]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert set(rows) == {f"outputs/metrics/{key}.json" for key in (*CAMPAIGN_KEYS, METRICS_KEY, LOAD_KEY)}
    for key in (*CAMPAIGN_KEYS, METRICS_KEY, LOAD_KEY):
        assert rows[f"outputs/metrics/{key}.json"]["data"]["campaign"] == params[key]
    detail = run(["dvc", "metrics", "show", "--json", "outputs/metrics/detail/headline.json"], repo)
    assert detail.returncode == 0, detail.stderr
    data = json.loads(detail.stdout)[""]["data"]["outputs/metrics/detail/headline.json"]["data"]
    assert data["campaign"] == params["campaign"]
    pairs = [k for k in data if k != "campaign"]
    assert pairs
    for pair in pairs:
        m = data[pair]
        assert {"best_k", "speedup_at_best_k", "mae_iid", "mae_empirical_overhead"} <= set(m)
        assert any(k.startswith("alpha_at_k") for k in m)
        assert set(m["best_k"]) == set(m["speedup_at_best_k"]) and "all" in m["best_k"]
        assert {"pooled", "all"} <= set(m["mae_iid"]) and {"pooled", "all"} <= set(m["mae_empirical_overhead"])

    plots = run(["dvc", "plots", "show", "--json"], repo)
    assert plots.returncode == 0, plots.stderr
    names = set(json.loads(plots.stdout)["data"])
    assert DECLARED_PLOTS <= names
    assert "outputs/figures/strategies.png" in names and "outputs/figures/speedup_map.png" in names
    html = run(["dvc", "plots", "show", "-o", str(tmp_path / "html")], repo)
    assert html.returncode == 0 and (tmp_path / "html" / "index.html").is_file(), html.stderr
    page = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert plot_page.MARK in page and network_loads(page) == []  # .dvc/config's page, not DVC's CDN one
    assert all(f'id = "{html_id(name)}"' in page for name in DECLARED_PLOTS)

    # A second commit with other numbers: diffs name both revisions, the short table's and the detail's.
    row = repo / "outputs" / "metrics" / "campaign.json"
    changed = json.loads(row.read_text())
    changed["speedup_max"] += 0.5
    row.write_text(json.dumps(changed, indent=2) + "\n")
    headline = repo / "outputs" / "metrics" / "detail" / "headline.json"
    changed = json.loads(headline.read_text())
    changed[pairs[0]]["speedup_at_best_k"]["all"] += 0.5
    headline.write_text(json.dumps(changed, indent=2) + "\n")
    assert run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "next"],
               repo).returncode == 0
    diff = run(["dvc", "metrics", "diff", "HEAD~1", "--json"], repo)
    assert diff.returncode == 0, diff.stderr
    delta = json.loads(diff.stdout)
    assert set(delta) == {"outputs/metrics/campaign.json"}
    assert delta["outputs/metrics/campaign.json"]["speedup_max"]["diff"] == pytest.approx(0.5)
    diff = run(["dvc", "metrics", "diff", "HEAD~1", "--json", "--targets", "outputs/metrics/detail/headline.json"],
               repo)
    assert diff.returncode == 0, diff.stderr
    delta = json.loads(diff.stdout)["outputs/metrics/detail/headline.json"]
    assert delta[f"{pairs[0]}.speedup_at_best_k.all"]["diff"] == pytest.approx(0.5)
    pdiff = run(["dvc", "plots", "diff", "HEAD~1", "--json"], repo)
    assert pdiff.returncode == 0, pdiff.stderr
    revs = json.loads(pdiff.stdout)["data"]["speedup_by_k"][0]["revisions"]
    assert set(revs) == {"HEAD~1", "workspace"}


@pytest.mark.slow
@needs_dvc
@needs_chromium
def test_every_declared_plot_is_drawn_offline(tmp_path):
    """benchmarks.dvc_plots_check on a fresh copy: `dvc plots show` as the README says, Chromium with no network."""
    repo = tmp_path / "repo"
    copy_repository(repo)
    checked = run([sys.executable, "-m", "benchmarks.dvc_plots_check", "--out", str(tmp_path / "shots")], repo,
                  timeout=400)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    plots = len(DECLARED_PLOTS) + len(list((repo / "outputs" / "figures").glob("*.png")))
    assert f"{plots} of {plots} declared plots drawn" in checked.stdout
    assert (tmp_path / "shots" / "dvc_plots.png").stat().st_size > 0
