"""Defaults have one source: the schema dataclasses (which read the library's constructors) merged
under the YAML, so a composed config holds every key and no code in pipeline/ falls back to a literal
with ``.get(key, default)``; and the entry point stays orchestration only."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def literal_gets(path: Path) -> list[str]:
    """``x.get(key, <literal>)`` calls in a file (the environment's variables excepted)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and len(node.args) == 2 and _literal(node.args[1])
                and ast.unparse(node.func.value) != "os.environ"):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_get_with_a_literal_default_in_pipeline():
    found = [hit for p in sorted((ROOT / "pipeline").rglob("*.py")) for hit in literal_gets(p)]
    assert not found, found


def test_the_finder_finds_them(tmp_path):
    (tmp_path / "x.py").write_text('a = cfg.get("k", 10)\nb = cfg.get("k")\nc = os.environ.get("A", "1")\n'
                                   'd = st.get("ks", [])\ne = m.get(key, (stage,))\n')
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = [h.split(": ", 1)[1] for h in literal_gets(tmp_path / "x.py")]
        assert found == ["cfg.get('k', 10)", "st.get('ks', [])"]
    finally:
        ROOT = root


def test_job_is_orchestration_only():
    tree = ast.parse((ROOT / "pipeline" / "jobs" / "execute.py").read_text())
    (job,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Job"]
    assert job.end_lineno - job.lineno + 1 < 80
    local = [n for n in ast.walk(job) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not local, "function-local imports in Job"


def test_the_entry_point_only_wires():
    """pipeline/run.py composes, checks and dispatches: no class of its own, and short; running a job, locking and
    publishing policy live in pipeline/jobs/ and store/."""
    source = (ROOT / "pipeline" / "run.py").read_text()
    tree = ast.parse(source)
    assert not [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert len(source.splitlines()) <= 130
