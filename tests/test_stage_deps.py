"""dvc.yaml's code deps are the import graph's (analysis.stage_deps): a stage cannot miss a module it imports,
nor rerun for one it does not."""
from __future__ import annotations

from pathlib import Path

import yaml

from analysis.import_graph import ROOT, imported_files
from analysis.stage_deps import differences, main, rewrite

ANALYSIS_MODULES = ("fit", "breakeven", "strategies", "report", "drift", "correctness", "jobs", "headline", "publish",
                    "time_model", "recommend", "pair_section", "trees", "answer")


def test_every_stage_lists_the_code_it_imports():
    text = (ROOT / "dvc.yaml").read_text()
    stages = yaml.safe_load(text)["stages"]
    assert set(stages) >= set(ANALYSIS_MODULES)
    for name in stages:
        assert {"analysis/common.py", f"analysis/{name}.py"} <= set(stages[name]["deps"])
    assert differences({"stages": stages}) == {}, "run `python -m analysis.stage_deps --write`"
    assert rewrite(text) == text, "run `python -m analysis.stage_deps --write`"


def _package(root: Path) -> None:
    (root / "analysis").mkdir()
    files = {"__init__.py": "",
             "a.py": "from analysis import b\nfrom typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from analysis import typing_only\n",
             "b.py": "def f():\n    import analysis.late  # a function-level import runs too\n",
             "late.py": "import numpy\n", "typing_only.py": "", "unused.py": ""}
    for name, body in files.items():
        (root / "analysis" / name).write_text(body)


def test_the_import_graph_follows_function_imports_and_skips_type_checking(tmp_path):
    _package(tmp_path)
    assert imported_files("analysis.a", tmp_path) == {"analysis/__init__.py", "analysis/a.py", "analysis/b.py",
                                                      "analysis/late.py"}


DVC_YAML = """\
stages:
  a:
    cmd: python -m analysis.a --flag
    deps:
      - analysis/unused.py
      - analysis/a.py
      - outputs/campaigns/${campaign}/speed
      - outputs/analysis/x.parquet
    outs:
      - out.parquet
"""


def test_write_replaces_the_code_deps_keeps_the_others_and_check_passes_after(tmp_path):
    _package(tmp_path)
    spec = yaml.safe_load(DVC_YAML)
    assert differences(spec, tmp_path) == {"a": ({"analysis/__init__.py", "analysis/b.py", "analysis/late.py"},
                                                 {"analysis/unused.py"})}
    written = rewrite(DVC_YAML, tmp_path)
    stage = yaml.safe_load(written)["stages"]["a"]
    assert stage["deps"] == ["analysis/__init__.py", "analysis/a.py", "analysis/b.py", "analysis/late.py",
                             "outputs/campaigns/${campaign}/speed", "outputs/analysis/x.parquet"]
    assert stage["outs"] == ["out.parquet"] and differences({"stages": {"a": stage}}, tmp_path) == {}
    assert rewrite(written, tmp_path) == written


def test_the_check_fails_on_the_committed_file_with_a_dep_removed(tmp_path, capsys):
    text = (ROOT / "dvc.yaml").read_text().replace(" analysis/common.py,", "", 1)
    (tmp_path / "dvc.yaml").write_text(text)
    assert main(["--file", str(tmp_path / "dvc.yaml")]) == 1
    assert "analysis/common.py" in capsys.readouterr().out
    assert main(["--file", str(tmp_path / "dvc.yaml"), "--write"]) == 0
    assert main(["--file", str(tmp_path / "dvc.yaml")]) == 0
