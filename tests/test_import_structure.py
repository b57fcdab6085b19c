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

from analysis.import_graph import imported_files, local_imports, module_file, named_imports

pytestmark = pytest.mark.usefixtures("memo_import_graph")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tuple(p for p in ("speclab", "pipeline", "analysis", "store", "engines") if (ROOT / p / "__init__.py").is_file())


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
    # a function-level import counts: pipeline.jobs.identity -> pipeline.jobs.inputs in either place
    assert "pipeline.jobs.inputs" in imports("pipeline.jobs.identity")


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
                                             ("speclab", "pipeline"), ("speclab", "analysis"), ("speclab", "engines"),
                                             ("store", "engines"), ("pipeline", "engines"), ("engines", "analysis")])
def test_a_floor_never_reaches_up(floor, forbidden):
    """analysis/ reads results through store/ and speclab's torch-free modules; the library and the store know
    nothing of the layers above them. Computed from every module's imports, so a new module is covered."""
    reached = {m: sorted(f for f in imported_files(m) if f.startswith(f"{forbidden}/")) for m in modules(floor)}
    assert not {m: r for m, r in reached.items() if r}, f"{floor}/ modules importing {forbidden}/"


def test_the_floor_check_sees_an_import_inside_a_function():
    assert "speclab/costs/planning.py" in imported_files("analysis.time_model")
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


# The floors of each package, lowest first: a module may import its own floor and the floors below it, never one
# above. A floor is a sub-package (its folder) or, for modules directly in the package, the entry points on top.
FLOORS = {
    "speclab": ["speclab.stats", "speclab.specs", "speclab.costs", "speclab.decoding", "speclab.models",
                "speclab.trees", "speclab.measures", "speclab.drafting", "speclab"],
    "pipeline": ["pipeline.config", "pipeline.tracking", "pipeline.prompts", "pipeline.jobs", "pipeline.engines",
                 "pipeline.stages", "pipeline"],
}


def floor_of(module: str) -> str:
    """The sub-package a module sits in (``speclab.decoding.loop`` -> ``speclab.decoding``); a module directly in
    its package (``pipeline.run``) or the package itself sits on the package's top floor."""
    parts = module.split(".")
    sub = ".".join(parts[:2])
    return sub if len(parts) > 2 or (len(parts) == 2 and (ROOT / Path(*parts)).is_dir()) else parts[0]


def arrows_up(graph: dict[str, set[str]], floors: list[str]) -> list[str]:
    """Every import in ``graph`` (module -> modules it imports) from a floor to a higher one of ``floors``, as
    'a -> b (floor -> floor)'; imports of other packages are not this check's."""
    rank = {f: i for i, f in enumerate(floors)}
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = floor_of(module), floor_of(target)
            if b in rank and rank[b] > rank[a]:
                out.append(f"{module} -> {target} ({a} -> {b})")
    return out


def floor_graph(package: str) -> dict[str, set[str]]:
    return {m: {t for t in named_imports(module_file(m)) if t.startswith(f"{package}.")} for m in modules(package)}


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_import_runs_up_a_floor(package):
    """The sub-packages' stated order (each one's __init__ docstring says what it may import) holds for every import,
    at module level or in a function: the graph with sub-packages as nodes has no arrow back up."""
    assert {floor_of(m) for m in modules(package)} <= set(FLOORS[package]), "a sub-package without a floor"
    assert not arrows_up(floor_graph(package), FLOORS[package])


def test_the_floor_check_sees_an_arrow_up():
    floors = FLOORS["pipeline"]
    assert arrows_up({"pipeline.config.schema": {"pipeline.stages.speed"}}, floors) == [
        "pipeline.config.schema -> pipeline.stages.speed (pipeline.config -> pipeline.stages)"]
    assert arrows_up({"pipeline.stages.speed": {"pipeline.config.schema", "pipeline.stages.shared"}}, floors) == []
    # a name taken from a package's __init__ is an import of that package, on its floor
    assert named_imports(module_file("pipeline.run")) >= {"pipeline.stages", "pipeline.jobs.execute"}
    assert arrows_up({"pipeline.jobs.runs": {"pipeline.stages"}}, floors) == [
        "pipeline.jobs.runs -> pipeline.stages (pipeline.jobs -> pipeline.stages)"]
    assert floor_of("pipeline.run") == "pipeline" and floor_of("speclab.decoding.loop") == "speclab.decoding"


# Two modules of one name are the same concept on two floors, and this says which.
SAME_CONCEPT = {
    "acceptance.py": "acceptance rules (speclab) and the stage that measures acceptance (pipeline)",
    "arms.py": "the arm as data (speclab.specs), an engine's arms (engines.llama_cpp), a job's arms (pipeline)",
    "batch.py": "the batched loop, the batch stage that runs it, the batch analysis that reads it",
    "divergence.py": "why a greedy output diverged (speclab) and the stage that asks it (pipeline)",
    "identity.py": "a config's hash (store) and a job's identity built on it (pipeline.jobs)",
    "load.py": "a load of concurrent requests: speclab's batched loop serving one (engines.speclab), the load stage "
               "(pipeline.stages), its analysis (analysis)",
    "inputs.py": "what a job reads besides its config (pipeline.jobs) and what a DVC stage reads (analysis)",
    "time_model.py": "the time model (speclab.costs) and its analysis (analysis)",
    "timing.py": "honest timing (speclab.decoding) and the timing stage that uses it (pipeline.stages)",
    "verdict.py": "the speculate-or-not rule (speclab.stats) and a job's verdict lines from it (pipeline.jobs)",
}


# The modules engine packages share (docs/engines.md's recipe): one name in each engine, the same concept: its
# settings, its runner, its arms, and for an engine run as servers its server process and its client.
ENGINE_MODULES = ("conf.py", "runner.py", "arms.py", "client.py", "server.py")
ANY_ENGINE = "engines/<name>/"  # how a docstring names the same module of every engine package


def _named(path: Path) -> bool:
    return path.name != "__init__.py" and not (path.parent.parent == ROOT / "engines" and path.name in ENGINE_MODULES)


def test_a_file_name_is_used_once_unless_the_same_concept():
    """No file name twice across speclab/, pipeline/, store/, analysis/ and engines/ except ``SAME_CONCEPT``'s and the
    modules every engine package has (``ENGINE_MODULES``)."""
    seen: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if _named(path):
                seen.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    assert {n: p for n, p in seen.items() if len(p) > 1 and n not in SAME_CONCEPT} == {}


def test_each_twin_names_its_other_floors():
    """A module of a ``SAME_CONCEPT`` name says so: its docstring names every other module of that name."""
    import ast

    paths: dict[str, list[Path]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name in SAME_CONCEPT:
                paths.setdefault(path.name, []).append(path)
    def engine_module(path: Path) -> bool:
        return path.parent.parent == ROOT / "engines" and path.name in ENGINE_MODULES

    silent = []
    for name, group in paths.items():
        for path in group:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            for t in group:
                if t == path or (engine_module(t) and engine_module(path)):
                    continue  # engine packages' modules of one name: the same concept by ENGINE_MODULES
                names = [t.relative_to(ROOT).as_posix(), *([ANY_ENGINE + t.name] if engine_module(t) else [])]
                if not any(n in doc for n in names):
                    silent.append(f"{path.relative_to(ROOT)} does not name {t.relative_to(ROOT)}")
    assert not silent


def test_an_engine_package_imports_the_seam_and_below_never_the_stages_or_another_engine():
    """engines/<name>/ holds all of one engine's code. It may import speclab, store and pipeline up to the seam
    (pipeline.engines); the stages, the entry points and the other engines it never imports, and pipeline imports no
    engine (it finds one by name: conf/engine/<name>.yaml's ``_target_``, engines/<name>/conf.py)."""
    above = ("pipeline.stages", "pipeline.run", "pipeline.recheck", "pipeline.workload")
    bad = []
    for module in modules("engines"):
        own = ".".join(module.split(".")[:2])
        for target in named_imports(module_file(module)):
            if target.startswith(above) or (target.startswith("engines.") and not target.startswith(own)):
                bad.append(f"{module} -> {target}")
    assert not bad
    assert {p.parent.name for p in (ROOT / "engines").glob("*/conf.py")} == {
        p.parent.name for p in (ROOT / "engines").glob("*/runner.py")} >= {"speclab", "llama_cpp"}
