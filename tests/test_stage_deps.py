"""dvc.yaml's code deps are the import graph's (analysis.stage_deps): a stage cannot miss a module it imports,
and lists a sub-package (or store/) as its folder, analysis/ file by file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from analysis.import_graph import ROOT, imported_files
from analysis.stage_deps import covers, differences, is_code, main, rewrite, stage_module

pytestmark = pytest.mark.usefixtures("memo_import_graph")

ANALYSIS_MODULES = ("fit", "breakeven", "strategies", "report", "drift", "correctness", "jobs", "headline", "publish",
                    "time_model", "recommend", "pair_section", "trees", "answer")


def test_every_stage_lists_the_code_it_imports():
    text = (ROOT / "dvc.yaml").read_text()
    stages = yaml.safe_load(text)["stages"]
    assert set(stages) >= set(ANALYSIS_MODULES)
    for name in stages:
        assert {"analysis/common.py", f"analysis/{name}.py"} <= set(stages[name]["deps"])
        # every file the script runs is hashed, whatever the grouping: a file dep or one in a folder dep
        deps = stages[name]["deps"]
        assert [p for p in imported_files(stage_module(stages[name]["cmd"])) if not covers(deps, p)] == [], name
        assert not [d for d in deps if d.startswith("speclab/") and d.endswith(".py") and d.count("/") > 1], name
    assert {"speclab/stats", "store"} <= set(stages["jobs"]["deps"])
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


def _sub_package(root: Path) -> None:
    """analysis/a.py imports a module of the sub-package analysis/sub and one of store/ (a package of FOLDERS)."""
    for folder in ("analysis/sub", "analysis/templates", "store"):
        (root / folder).mkdir(parents=True)
    files = {"analysis/__init__.py": "", "analysis/a.py": "from analysis.sub import x\nimport store.s\n",
             "analysis/sub/__init__.py": "", "analysis/sub/x.py": "", "analysis/sub/unused.py": "",
             "analysis/templates/page.md": "", "store/__init__.py": "", "store/s.py": "", "store/t.py": ""}
    for name, body in files.items():
        (root / name).write_text(body)


SUB_YAML = """\
stages:
  a:
    cmd: python -m analysis.a
    deps: [analysis/a.py, analysis/sub/x.py, store/s.py, analysis/templates, outputs/x.parquet]
"""


def test_a_sub_package_is_listed_as_its_folder_and_a_template_folder_is_data(tmp_path):
    _sub_package(tmp_path)
    assert is_code("analysis/sub", tmp_path) and is_code("store", tmp_path)
    assert not is_code("analysis/templates", tmp_path) and not is_code("outputs/x.parquet", tmp_path)
    assert differences(yaml.safe_load(SUB_YAML), tmp_path) == {
        "a": ({"analysis/__init__.py", "analysis/sub", "store"}, {"analysis/sub/x.py", "store/s.py"})}
    written = rewrite(SUB_YAML, tmp_path)
    assert yaml.safe_load(written)["stages"]["a"]["deps"] == [
        "analysis/__init__.py", "analysis/a.py", "analysis/sub", "store", "analysis/templates", "outputs/x.parquet"]
    assert differences(yaml.safe_load(written), tmp_path) == {} and rewrite(written, tmp_path) == written
    # the folder dep goes when the last import of it goes
    (tmp_path / "analysis" / "a.py").write_text("import store.s\n")
    assert differences(yaml.safe_load(written), tmp_path) == {"a": (set(), {"analysis/sub"})}


def test_the_check_fails_on_the_committed_file_with_a_dep_removed(tmp_path, capsys):
    committed = (ROOT / "dvc.yaml").read_text()
    for dep in ("analysis/common.py", "speclab/stats", "store"):   # a file, a sub-package, a flat package
        text = committed.replace(f" {dep},", "", 1)
        assert text != committed, dep
        (tmp_path / "dvc.yaml").write_text(text)
        assert main(["--file", str(tmp_path / "dvc.yaml")]) == 1
        assert f"'{dep}'" in capsys.readouterr().out
        assert main(["--file", str(tmp_path / "dvc.yaml"), "--write"]) == 0
        assert main(["--file", str(tmp_path / "dvc.yaml")]) == 0
        assert (tmp_path / "dvc.yaml").read_text() == committed
