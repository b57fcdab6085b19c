"""dvc.yaml's code deps, from the import graph: each stage lists the repository's own code its script imports
(transitively), grouped by package folder, so a code change reruns every stage it can affect.

    python -m analysis.stage_deps           (check: lists each stage whose code deps differ; exit 1 if any)
    python -m analysis.stage_deps --write   (rewrite those deps in dvc.yaml)

A module in a sub-package (speclab/stats/intervals.py) is listed as the sub-package's folder (speclab/stats: DVC
hashes a folder dep as a whole, .dvcignore leaves out __pycache__), a module at the top of a package
(analysis/fit.py, speclab/__init__.py) as its file, and a package of FOLDERS (store/) as its folder: the folder
reruns a stage for a module of it that the stage does not import, never misses one it does. Code deps are the
.py files and package folders (with an __init__.py) among a stage's deps; its other deps (results, tables,
templates) are kept as written, after them. A stage's deps are written as one flow list (`deps: [...]`,
wrapped), which keeps dvc.yaml short; entries holding a YAML flow indicator (`${campaign}`) are quoted.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from analysis.import_graph import ROOT, imported_files

DVC_YAML = ROOT / "dvc.yaml"
WIDTH = 118
DEPS_INDENT = "    "        # `deps:` under a stage under `stages:`
CONTINUATION = " " * 6
# Flat packages listed as one folder rather than file by file: nearly every stage imports most of store/ (a
# stage's own analysis/ modules stay files, so an edit of one script reruns only the stages that import it).
FOLDERS = ("store",)


def stage_module(cmd: str) -> str | None:
    """The module a stage runs (`python -m analysis.x --opt` -> analysis.x), or None for another command."""
    match = re.match(r"python\s+-m\s+([\w.]+)", cmd)
    return match.group(1) if match else None


def dep_of(path: str) -> str:
    """The dep that covers the module file ``path``: its sub-package's folder (speclab/stats/intervals.py ->
    speclab/stats, engines/llama_cpp/arms.py -> engines/llama_cpp), its package's folder for a package of
    FOLDERS (store/seal.py -> store), else the file itself (analysis/fit.py)."""
    parts = path.split("/")
    if parts[0] in FOLDERS:
        return parts[0]
    return "/".join(parts[:2]) if len(parts) > 2 else path


def code_deps(module: str, root: Path = ROOT) -> list[str]:
    return sorted({dep_of(path) for path in imported_files(module, root)})


def is_code(dep: str, root: Path = ROOT) -> bool:
    """A code dep: a .py file, or a package's folder (analysis/templates, a folder without __init__.py, is not)."""
    return dep.endswith(".py") or (root / dep / "__init__.py").is_file()


def covers(deps: list[str], path: str) -> bool:
    """Whether ``deps`` hash the file ``path``: it is one of them or lies in a folder of them."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def wanted_deps(stage: dict, root: Path = ROOT) -> list[str]:
    """The stage's deps with its code entries replaced by the import graph's (first, sorted)."""
    module = stage_module(stage["cmd"])
    deps = [str(d) for d in stage.get("deps", [])]
    data = [d for d in deps if not is_code(d, root)]
    return (code_deps(module, root) if module else [d for d in deps if is_code(d, root)]) + data


def differences(spec: dict, root: Path = ROOT) -> dict[str, tuple[set[str], set[str]]]:
    """Per stage whose code deps differ from its imports' (imported but not listed, listed but not imported)."""
    out = {}
    for name, stage in spec["stages"].items():
        module = stage_module(stage["cmd"])
        if not module:
            continue
        listed = {str(d) for d in stage.get("deps", []) if is_code(str(d), root)}
        needed = set(code_deps(module, root))
        if listed != needed:
            out[name] = (needed - listed, listed - needed)
    return out


def _item(dep: str) -> str:
    return f'"{dep}"' if re.search(r"[\[\]{},:#&*!|>'\"%@`]", dep) else dep


def render_deps(deps: list[str], root: Path = ROOT) -> list[str]:
    """`deps: [...]` as lines: the code deps, then the others from a new line, each run wrapped at WIDTH."""
    code = [_item(d) for d in deps if is_code(d, root)]
    data = [_item(d) for d in deps if not is_code(d, root)]
    lines: list[str] = []
    for group in (g for g in (code, data) if g):
        line, fresh = (f"{DEPS_INDENT}deps: [" if not lines else CONTINUATION), True
        for item in group:
            if not fresh and len(line) + 2 + len(item) + 1 > WIDTH:  # ", item" and the closing "," or "]"
                lines.append(line + ",")
                line, fresh = CONTINUATION, True
            line += item if fresh else ", " + item
            fresh = False
        lines.append(line + ",")
    lines[-1] = lines[-1][:-1] + "]"
    return lines


def _deps_span(lines: list[str], stage: str) -> tuple[int, int]:
    """[start, end) of the lines holding ``stage``'s `deps:` (block or flow style)."""
    begin = lines.index(f"  {stage}:")
    end = next((i for i in range(begin + 1, len(lines)) if re.match(r"^ {0,2}\S", lines[i])), len(lines))
    start = next(i for i in range(begin + 1, end) if lines[i].startswith(f"{DEPS_INDENT}deps:"))
    if lines[start].rstrip().endswith("deps:"):       # block style: the `- item` lines below it
        stop = start + 1
        while stop < end and lines[stop].startswith(DEPS_INDENT + "  "):
            stop += 1
        return start, stop
    stop = start
    while not lines[stop].split(" #")[0].rstrip().endswith("]"):
        stop += 1
    return start, stop + 1


def rewrite(text: str, root: Path = ROOT) -> str:
    """dvc.yaml's text with every stage's deps rendered from the import graph (nothing else changes)."""
    spec = yaml.safe_load(text)
    lines = text.split("\n")
    for name, stage in spec["stages"].items():
        if not stage.get("deps"):
            continue
        start, stop = _deps_span(lines, name)
        lines[start:stop] = render_deps(wanted_deps(stage, root), root)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.stage_deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite dvc.yaml's code deps from the import graph")
    parser.add_argument("--file", type=Path, default=DVC_YAML)
    args = parser.parse_args(argv)
    text = args.file.read_text()
    if args.write:
        new = rewrite(text)
        if new != text:
            args.file.write_text(new)
            print(f"analysis.stage_deps: rewrote the deps in {args.file}")
        return 0
    diff = differences(yaml.safe_load(text))
    for name, (missing, unused) in diff.items():
        print(f"stage {name}: imports {sorted(missing)} not in its deps; "
              f"lists {sorted(unused)} its imports do not need")
    if diff or rewrite(text) != text:
        print("analysis.stage_deps: dvc.yaml is out of date; run `python -m analysis.stage_deps --write`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
