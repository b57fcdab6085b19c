"""The two test tiers: `make test` leaves out the tests marked slow, `make test-all` (and CI) runs them too."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest_args(target: str) -> list[str]:
    """The arguments of the pytest command that `make <target>` would run (make -n: nothing runs)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    commands = [shlex.split(line) for line in out.splitlines() if re.search(r"-m pytest\b", line)]
    assert len(commands) == 1, out
    return commands[0][commands[0].index("pytest") + 1:]


def _marker_expression(args: list[str]) -> str | None:
    """The last -m expression (pytest keeps the last one given)."""
    expr = None
    for i, a in enumerate(args):
        if a == "-m":
            expr = args[i + 1]
        elif a.startswith("-m") and len(a) > 2:
            expr = a[2:]
    return expr


def test_slow_marker_is_registered_and_strict(pytestconfig):
    assert any(m.split(":")[0].strip() == "slow" for m in pytestconfig.getini("markers"))
    # Without --strict-markers a misspelt mark would quietly leave a slow test in the fast tier.
    assert "--strict-markers" in pytestconfig.getini("addopts")


def test_addopts_select_no_tier():
    """The tiers are chosen by the Makefile alone: an -m in addopts would be overridden by make test-qwen's
    and mutmut's own -m, or would hide the slow tier from make test-all."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert _marker_expression(shlex.split(ini.get("addopts", ""))) is None


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_deselects_slow_and_make_test_all_does_not():
    assert _marker_expression(_pytest_args("test")) == "not slow"
    assert _marker_expression(_pytest_args("test-all")) is None


def test_ci_runs_both_tiers():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test-all" in lines
    assert "make test" not in lines


def test_slow_tier_is_not_empty():
    """Some test file marks tests slow (a tier that lost every mark would make make test as slow as make test-all)."""
    marked = [p.name for p in (ROOT / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.slow\b", p.read_text()) and p.name != Path(__file__).name]
    assert marked
