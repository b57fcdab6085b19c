"""Every preset and stage option composes to the config hash it had before arms were a list and settings had
one home: tests/golden/config_hashes.json was written by composing each of them at the commit before that
change (each sweep preset at every point of its grid; each stage option alone and with another drafter and k
policy). A change that renames a job (and so orphans its stored results) fails here, preset by preset.

Rewrite after an intended change of identity: ``.venv/bin/python tests/test_config_hashes.py --write``.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from pipeline.config.schema import register
from pipeline.jobs.identity import config_hash

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "config_hashes.json"


def cases() -> list[list[str]]:
    """Every sweep preset at each point of its grid, every stage option alone and with other options."""
    out = []
    for path in sorted((ROOT / "conf" / "sweep").glob("*.yaml")):
        params = ((yaml.safe_load(path.read_text()).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
        grid = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
        out += [[f"+sweep={path.stem}", *point] for point in itertools.product(*grid)]
    for path in sorted((ROOT / "conf" / "stage").glob("*.yaml")):
        out += [[f"stage={path.stem}"], [f"stage={path.stem}", "drafter=prompt_lookup", "k_policy=cost_model"]]
    # llama.cpp's stages: its configurations were its own engine.arms list before stage.arms (store/legacy_arms.py)
    out += [["engine=llama_cpp", f"stage={stage}"] for stage in ("timing", "acceptance", "speed", "divergence", "plan",
                                                                 "quick")]
    return out


def hashes() -> dict[str, str]:
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return {" ".join(c): config_hash(compose(config_name="config",
                                                 overrides=[*c, "outputs_dir=/nonexistent", "mlflow.enabled=false"]))
                for c in cases()}


@pytest.mark.slow  # 137 compositions; tests/test_migration.py checks every recorded job in the fast tier
def test_every_preset_and_stage_option_keeps_its_config_hash():
    golden = json.loads(GOLDEN.read_text())
    now = hashes()
    assert set(now) == set(golden), f"presets added or removed: {sorted(set(now) ^ set(golden))} (rewrite the file)"
    changed = {case: (golden[case], now[case]) for case in golden if now[case] != golden[case]}
    assert not changed, f"jobs renamed (stored results would be orphaned): {changed}"


@pytest.mark.parametrize("override", ["stage.arms=[{},{method:hf_assisted}]", "stage.rounds=2"])
def test_the_check_sees_a_changed_job(override):
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["stage=speed", override, "outputs_dir=/nonexistent",
                                                         "mlflow.enabled=false"])
    assert config_hash(cfg) != json.loads(GOLDEN.read_text())["stage=speed"]


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps(hashes(), indent=1, sort_keys=True) + "\n")
