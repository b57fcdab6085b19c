"""Re-check the survivors of a finished ``mutmut run`` against tests written since, without a full run.

    .venv/bin/python mutation/recheck.py                      # tests/test_core_golden.py against every survivor
    .venv/bin/python mutation/recheck.py tests/test_stats.py  # other tests
    .venv/bin/python mutation/recheck.py --open               # only survivors not argued equivalent
    .venv/bin/python mutation/recheck.py --unchecked          # mutants a stopped run did not reach

A survivor passed every test that reached it in the run; it is killed now if one of the given tests (copied
afresh into ``mutants/tests``) fails with it switched on (mutmut's ``MUTANT_UNDER_TEST``), and then recorded as
killed in mutmut's results, so ``mutation/score.py`` and ``mutmut results`` count it. Sound because tests only
get added: a mutant survives iff all tests pass. ``make mutation`` (a full run) reproduces the verdicts.
``--unchecked`` checks the mutants a stopped run never reached with the given tests only: a failure is a kill,
a pass is recorded as a survivor (conservative: the run's other tests might have killed it).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
SURVIVED = {0, 5, 33}  # survived, or no test reached it


def survivors(codes: set) -> dict[str, Path]:
    out = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code in codes:
                out[name] = meta
    return out


def killed_by(name: str, tests: list[str]) -> bool:
    env = {**os.environ, "MUTANT_UNDER_TEST": name, "OMP_NUM_THREADS": "1", "SPECLAB_TEST_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout=90",
                        "-m", "not real_model", *tests], cwd=MUTANTS, env=env, capture_output=True, text=True)
    return r.returncode not in (0, 5)


def argued_equivalent() -> set[str]:
    import yaml

    path = ROOT / "mutation" / "equivalent.yaml"
    return set(yaml.safe_load(path.read_text()) or {}) if path.exists() else set()


def main(argv: list[str]) -> int:
    only_open, unchecked = "--open" in argv, "--unchecked" in argv
    tests = [a for a in argv if not a.startswith("--")] or ["tests/test_core_golden.py"]
    if not MUTANTS.is_dir():
        print("no mutants/ folder: run `make mutation` first", file=sys.stderr)
        return 2
    shutil.copytree(ROOT / "tests", MUTANTS / "tests", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    todo = survivors({None} if unchecked else SURVIVED)
    if only_open:
        todo = {n: m for n, m in todo.items() if n not in argued_equivalent()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = dict(zip(todo, pool.map(lambda n: killed_by(n, tests), todo)))
    for meta in {m for m in todo.values()}:
        data = json.loads(meta.read_text())
        for name, killed in verdicts.items():
            if todo[name] == meta and (killed or unchecked):
                data["exit_code_by_key"][name] = 1 if killed else 0
        meta.write_text(json.dumps(data, indent=4))
    print(f"{sum(verdicts.values())} of {len(todo)} {'unchecked mutants' if unchecked else 'survivors'} killed by "
          f"{' '.join(tests)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
