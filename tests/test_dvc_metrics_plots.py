"""`dvc metrics` and `dvc plots` work on a fresh copy of the repository (dvc.yaml's code deps: test_stage_deps.py).

The copy is what a clone would hold (tracked and not ignored files, one commit); the metrics and
plot files are committed results, so no `dvc repro` is needed to show or diff them.
"""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from test_dvc_safety import BIN, REPO, copy_repository, run

DECLARED_PLOTS = {"speedup_by_k", "speedup_predicted_vs_measured", "alpha_by_k", "step_time_vs_pass_length",
                  "time_model_predicted_vs_measured"}

needs_dvc = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")


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

    shown = run(["dvc", "metrics", "show", "--json"], repo)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)[""]["data"]["outputs/metrics/headline.json"]["data"]
    assert data["campaign"] == yaml.safe_load((repo / "params.yaml").read_text())["campaign"]
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

    # A second commit with other numbers: diffs name both revisions.
    headline = repo / "outputs" / "metrics" / "headline.json"
    changed = json.loads(headline.read_text())
    changed[pairs[0]]["speedup_at_best_k"]["all"] += 0.5
    headline.write_text(json.dumps(changed, indent=2) + "\n")
    assert run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "next"],
               repo).returncode == 0
    diff = run(["dvc", "metrics", "diff", "HEAD~1", "--json"], repo)
    assert diff.returncode == 0, diff.stderr
    delta = json.loads(diff.stdout)["outputs/metrics/headline.json"]
    assert delta[f"{pairs[0]}.speedup_at_best_k.all"]["diff"] == pytest.approx(0.5)
    pdiff = run(["dvc", "plots", "diff", "HEAD~1", "--json"], repo)
    assert pdiff.returncode == 0, pdiff.stderr
    revs = json.loads(pdiff.stdout)["data"]["speedup_by_k"][0]["revisions"]
    assert set(revs) == {"HEAD~1", "workspace"}
