"""Which of the repository's own source files a module executes when imported, found statically (no import runs,
so torch is never loaded). dvc.yaml's code deps (analysis.stage_deps) and the import-structure tests use it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_PACKAGES = ("analysis", "speclab", "pipeline", "store", "engines")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file that defines module ``name`` (``pkg/mod.py`` or ``pkg/mod/__init__.py``), or None."""
    path = root / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _packages(name: str) -> set[str]:
    """``name`` and every package above it: importing a.b.c runs a, a.b and a.b.c."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def named_imports(path: Path, root: Path = ROOT) -> set[str]:
    """The local modules a file's import statements name, anywhere but under `if TYPE_CHECKING:` (which never runs):
    ``from pkg import module`` names ``pkg.module``, ``from pkg import name`` names the package ``pkg`` itself; the
    packages Python runs on the way are not named (``local_imports`` adds them)."""
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
            names |= {f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}", root) else node.module
                      for a in node.names}
    return {n for n in names if n.split(".")[0] in LOCAL_PACKAGES and module_file(n, root)}


def local_imports(path: Path, root: Path = ROOT) -> set[str]:
    """Local modules a file imports (anywhere but under `if TYPE_CHECKING:`), with their packages."""
    return {p for name in named_imports(path, root) for p in _packages(name) if module_file(p, root)}


def imported_files(module: str, root: Path = ROOT) -> set[str]:
    """Every local source file (repository-relative, posix) that importing ``module`` executes, transitively."""
    seen: set[str] = set()
    todo = sorted(_packages(module))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name, root)
        if path is None:
            raise ModuleNotFoundError(f"no module {name!r} under {root}")
        todo.extend(local_imports(path, root))
    return {module_file(n, root).relative_to(root).as_posix() for n in seen}
