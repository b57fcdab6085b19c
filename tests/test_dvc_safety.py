"""A failing `dvc repro` leaves the committed results alone.

DVC removes a stage's outputs before running it unless they are `persist: true`; with plain files
in git (`cache: false`) a run that then failed would leave them deleted. This runs the real
`dvc repro` on a copy of the repository with one truncated input.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
OUTPUTS = ("outputs/analysis/", "outputs/figures/", "outputs/metrics/", "outputs/report.md")

pytestmark = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in .venv")


def run(cmd: list[str], cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def copy_repository(dst: Path) -> None:
    """The files git would see (tracked and not ignored: no .venv, mlflow.db, outputs/.hydra), as a fresh repo."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():  # a deleted but still indexed file is listed too
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-qm", "copy"],
                ["dvc", "config", "core.analytics", "false"]):
        assert run(cmd, dst).returncode == 0, cmd


@pytest.mark.slow
def test_failed_repro_keeps_committed_outputs(tmp_path):
    repo = tmp_path / "repo"
    copy_repository(repo)
    bad = sorted((repo / "outputs" / "campaigns" / "reference" / "speed").glob("*.parquet"))[0]
    bad.write_bytes(bad.read_bytes()[:1000])
    rel = bad.relative_to(repo).as_posix()

    result = run(["dvc", "repro"], repo)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    naming = [line for line in result.stderr.splitlines() if rel in line]
    assert len(naming) == 1, result.stderr
    # the campaign is published: its manifest finds the file changed before any reader opens it
    assert re.fullmatch(rf"analysis\.\w+: error: {re.escape(rel)} does not match its checksum in "
                        r"outputs/campaigns/reference/PUBLISHED \(damaged or edited\)", naming[0]), naming[0]
    status = run(["git", "status", "--porcelain"], repo).stdout.splitlines()
    deleted = [line for line in status if line[:2].strip() == "D"]
    touched_outputs = [line for line in status if line[3:].startswith(OUTPUTS)]
    assert not deleted and not touched_outputs, status
    assert [line[3:] for line in status if line[3:].startswith("outputs/")] == [rel]
