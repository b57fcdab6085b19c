"""The acceptance stage's console lines: a few configurations in detail (per kind and draft position), a grid (the
planner's) one line per configuration, with its per-kind rates inline."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.stages import acceptance

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("acc")
    res = subprocess.run([sys.executable, "-m", "pipeline.run", "stage=acceptance", "pair=tiny_random", "prompts=smoke",
                          "stage.ks=[1,2,3]", "max_new_tokens=8", "mlflow.enabled=false", f"outputs_dir={out}",
                          f"hydra.run.dir={out}/run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    [path] = list(out.glob("campaigns/*/acceptance/*.parquet"))
    return pd.read_parquet(path)


def test_a_grid_prints_one_line_per_configuration(rows):
    lines = acceptance.summarize(rows, None).summary
    configs = [ln for ln in lines if ln.startswith("k=")]
    assert len(configs) == 3 and all(ln.startswith(("k=", "replay:")) for ln in lines)
    assert all("prose " in ln and "code " in ln and "structured " in ln for ln in configs)
    assert not any("by draft position" in ln for ln in lines)


def test_a_single_configuration_prints_its_kinds_and_the_positions_reached(rows):
    lines = acceptance.summarize(rows[rows.k == 3], None).summary
    assert lines[0].startswith("k=3: pooled alpha") and sum(ln.startswith("  ") for ln in lines) == 4
    positions = [ln for ln in lines if "by draft position" in ln][0]
    assert "nan" not in positions
