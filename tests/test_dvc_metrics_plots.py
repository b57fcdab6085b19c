"""`dvc metrics` and `dvc plots` work on a fresh copy of the repository, and dvc.yaml's deps are complete.

The copy is what a clone would hold (tracked and not ignored files, one commit); the metrics and
plot files are committed results, so no `dvc repro` is needed to show or diff them.
"""
from __future__ import annotations

import ast
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_dvc_safety import BIN, REPO, copy_repository, run

DECLARED_PLOTS = {"speedup_by_k", "speedup_predicted_vs_measured", "alpha_by_k", "step_time_vs_pass_length",
                  "time_model_predicted_vs_measured"}
ANALYSIS_MODULES = ("fit", "breakeven", "strategies", "report", "drift", "correctness", "jobs", "headline", "publish",
                    "time_model", "recommend", "pair_section", "trees", "answer")
LOCAL_PACKAGES = ("analysis", "speclab", "pipeline", "store")

needs_dvc = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")


def test_analysis_imports_no_torch():
    code = ("import analysis.fit, analysis.breakeven, analysis.strategies, analysis.report, analysis.drift, "
            "analysis.correctness, analysis.jobs, analysis.headline, analysis.publish, analysis.time_model, "
            "analysis.recommend, analysis.pair_section, analysis.trees, analysis.answer, speclab.estimators; "
            "import sys; assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _module_file(name: str) -> Path | None:
    path = REPO / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _local_imports(path: Path) -> set[str]:
    """Local modules a file imports (anywhere but under `if TYPE_CHECKING:`), with their packages."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
               for n in ast.walk(node)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] in LOCAL_PACKAGES:
            out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {n for n in out if _module_file(n)}


def imported_files(module: str) -> set[str]:
    """Every local source file that importing ``module`` executes (transitively, statically)."""
    seen, todo = set(), [module, *(module.split(".")[0],)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_local_imports(_module_file(name)))
    return {_module_file(n).relative_to(REPO).as_posix() for n in seen}


def test_every_stage_lists_the_code_it_imports():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        module = stage["cmd"].removeprefix("python -m ").split()[0]  # the module, without its options
        needed = imported_files(module)
        assert {"analysis/common.py", f"analysis/{name}.py"} <= needed
        missing = needed - set(stage["deps"])
        assert not missing, f"stage {name}: imports {sorted(missing)} but does not list them as deps"
        unused = {d for d in stage["deps"] if d.endswith(".py")} - needed
        assert not unused, f"stage {name}: lists {sorted(unused)} as deps but does not import them"
    assert set(stages) >= {f"{m}" for m in ANALYSIS_MODULES}


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
