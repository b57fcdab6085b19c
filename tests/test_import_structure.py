"""The packages' import structure: every module of pipeline/ and analysis/ imports on its own, and no
two modules of our packages import each other (directly or around a longer loop), whether at module
level or inside a function."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from analysis.import_graph import imported_files, local_imports, module_file

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tuple(p for p in ("speclab", "pipeline", "analysis", "store") if (ROOT / p / "__init__.py").is_file())


def modules(package: str) -> list[str]:
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


ALL = [m for p in PACKAGES for m in modules(p)]


def imports(module: str) -> set[str]:
    """Our modules that ``module`` imports anywhere (module level or in a function), with their packages,
    but under ``if TYPE_CHECKING:``, which never runs."""
    return (local_imports(module_file(module)) & set(ALL)) - {module}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_our_modules():
    loop = cycle({m: imports(m) for m in ALL})
    assert loop is None, "import cycle: " + " -> ".join(loop)


def test_the_cycle_finder_finds_cycles():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    # a function-level import counts: pipeline.jobs -> pipeline.job_inputs in either place
    assert "pipeline.job_inputs" in imports("pipeline.jobs")


def _import_alone(module: str) -> tuple[str, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    return module, res.returncode, (res.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.slow
@pytest.mark.parametrize("package", ["pipeline", "analysis"])
def test_every_module_imports_alone(package):
    """Each module in a fresh interpreter: an import that only works after another module was loaded fails here."""
    with ThreadPoolExecutor(2) as pool:
        failed = [(m, err) for m, rc, err in pool.map(_import_alone, modules(package)) if rc]
    assert not failed, failed


@pytest.mark.parametrize("floor,forbidden", [("analysis", "pipeline"), ("store", "pipeline"), ("store", "analysis"),
                                             ("speclab", "pipeline"), ("speclab", "analysis")])
def test_a_floor_never_reaches_up(floor, forbidden):
    """analysis/ reads results through store/ and speclab's torch-free modules; the library and the store know
    nothing of the layers above them. Computed from every module's imports, so a new module is covered."""
    reached = {m: sorted(f for f in imported_files(m) if f.startswith(f"{forbidden}/")) for m in modules(floor)}
    assert not {m: r for m, r in reached.items() if r}, f"{floor}/ modules importing {forbidden}/"


def test_the_floor_check_sees_an_import_inside_a_function():
    assert "speclab/planning.py" in imported_files("analysis.time_model")
    assert "pipeline/stages/__init__.py" in imported_files("pipeline.run")


def test_importing_every_analysis_module_loads_no_torch():
    names = modules("analysis")
    code = (f"import {', '.join(names)}; import sys; "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'pipeline'], 'pipeline was imported'")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(names) >= 20
