"""The store: paths and names, stage files with their provenance records, config identity, the latest plan."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from store import identity, layout, plans
from store.records import StageFileError, check_stage_file, open_stage_file, read_meta, read_stage_files, write_parquet

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("x", pa.int64())])


def config_hash(config: dict, inputs: dict | None = None) -> str:
    """The store's hash with the keys the pipeline's schema declares hash-neutral."""
    from pipeline.config.schema import HASH_NEUTRAL, VOLATILE

    return identity.config_hash(config, inputs, neutral=HASH_NEUTRAL, volatile=VOLATILE)


CONFIG = {"stage": {"name": "speed", "ks": [2, 4]}, "k": 4, "pair": {"name": "p"},
          "drafter": {"name": "model"}, "k_policy": {"name": "fixed"}}


def test_store_imports_no_torch_hydra_or_omegaconf():
    modules = sorted(p.stem for p in (ROOT / "store").glob("*.py") if p.stem != "__init__")
    code = (f"import {', '.join(f'store.{m}' for m in modules)}; import sys; "
            "assert not {'torch', 'hydra', 'omegaconf'} & set(sys.modules), 'store imported ' + "
            "str({'torch', 'hydra', 'omegaconf'} & set(sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_config_hash_ignores_where_a_job_ran_and_the_code_that_runs_a_setting():
    base = config_hash(CONFIG)
    moved = {**CONFIG, "campaign": "other", "outputs_dir": "/elsewhere", "threads": 2, "force": True,
             "mlflow": {"enabled": False}}
    named = {**CONFIG, "drafter": {"_target_": "speclab.decoding.drafters.ModelDrafter", "name": "model"},
             "k_policy": {"_target_": "speclab.policies.FixedK", "name": "fixed"}}
    assert config_hash(moved) == config_hash(named) == base
    assert config_hash({**CONFIG, "k": 3}) != base
    assert config_hash({**CONFIG, "drafter": {"name": "model", "target": "x"}}) != base  # only `_target_`


def test_config_hash_leaves_out_keys_added_later_at_their_old_value():
    base = config_hash(CONFIG)
    assert config_hash({**CONFIG, "stage": {**CONFIG["stage"], "recommended": False}}) == base
    assert config_hash({**CONFIG, "stage": {**CONFIG["stage"], "recommended": True}}) != base
    # stage.k_policies is neutral for the acceptance stage only: the speed stage hashed it before.
    assert config_hash({**CONFIG, "stage": {**CONFIG["stage"], "k_policies": []}}) != base


def test_config_hash_names_the_inputs_frozen_or_given():
    frozen = {**CONFIG, "inputs": {"plan": "p-aaaa"}}
    assert config_hash(CONFIG, {"plan": "p-aaaa"}) == config_hash(frozen)
    assert config_hash(CONFIG, {}) == config_hash(CONFIG)
    assert config_hash(CONFIG, {"plan": "p-bbbb"}) != config_hash(frozen)


def test_pipeline_hash_of_a_composed_config_ignores_target_keys(tmp_path):
    from omegaconf import OmegaConf

    from pipeline.jobs.identity import config_hash
    from pipeline_helpers import make_cfg

    cfg = make_cfg(tmp_path, "stage=speed")
    plain = OmegaConf.to_container(cfg, resolve=True)  # the schema has no `_target_` yet: add it to a copy
    plain["drafter"]["_target_"], plain["k_policy"]["_target_"] = "speclab.decoding.drafters.ModelDrafter", "speclab.FixedK"
    assert config_hash(OmegaConf.create(plain)) == config_hash(cfg)


def test_flatten_gives_dotted_keys():
    assert identity.flatten({"a": {"b": 1, "c": {"d": [2]}}, "e": None, "f": {}}) == {"a.b": 1, "a.c.d": [2], "e": None}


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", None, "x" * 65])
def test_a_campaign_is_one_folder(tmp_path, name):
    with pytest.raises(layout.StoreError, match="is not a campaign name"):
        layout.campaign_dir(tmp_path, name)


def test_stage_paths_list_finished_files_of_a_pair(tmp_path):
    assert layout.stage_file(tmp_path, "c", "speed", "p", "0123") == tmp_path / "campaigns/c/speed/p-0123.parquet"
    folder = layout.stage_dir(tmp_path, "c", "speed")
    folder.mkdir(parents=True)
    for name in ("p-1.parquet", "q-1.parquet", ".tmp-p-2.parquet", "p-3.parquet"):
        (folder / name).touch()
    assert [p.name for p in layout.stage_paths(tmp_path, "c", "speed", "p")] == ["p-1.parquet", "p-3.parquet"]
    assert len(layout.stage_paths(tmp_path, "c", "speed")) == 3
    with pytest.raises(ValueError, match="unknown stage 'sped'"):
        layout.stage_paths(tmp_path, "c", "sped")


def _write(tmp_path: Path, campaign="c", stage="speed", pair="p", config_hash="00aa", rows=2, **meta) -> Path:
    path = layout.stage_file(tmp_path, campaign, stage, pair, config_hash)
    record = {"stage": stage, "campaign": campaign, "pair": pair, "config_hash": config_hash, **meta}
    return write_parquet(pd.DataFrame({"x": range(rows)}), SCHEMA, path, record)


def test_a_stage_file_reads_back_with_its_record(tmp_path):
    path = _write(tmp_path, finished_at="2026-01-01")
    f = open_stage_file(path, SCHEMA, "00aa", "speed", "c")
    assert f.meta["rows"] == 2 and f.meta["finished_at"] == "2026-01-01" and list(f.data.x) == [0, 1]
    assert read_meta(path) == f.meta and check_stage_file(path, SCHEMA, "00aa") is None
    assert [g.path for g in read_stage_files(tmp_path, "c", "speed")] == [path]


@pytest.mark.parametrize("damage, expected", [
    (lambda p: p.write_bytes(p.read_bytes()[:40]), "is not a readable Parquet file"),
    (lambda p: pd.DataFrame({"x": [1]}).to_parquet(p), "carries no speclab provenance record"),
    (lambda p: write_parquet(pd.DataFrame({"y": [1]}), pa.schema([("y", pa.int64())]), p, {}), "has columns other"),
    (lambda p: p.rename(p.with_name("p-11bb.parquet")), "does not match its provenance record"),
])
def test_a_damaged_or_misplaced_stage_file_says_why(tmp_path, damage, expected):
    path = _write(tmp_path)
    damage(path)
    path = layout.stage_paths(tmp_path, "c", "speed")[0]
    with pytest.raises(StageFileError, match=expected) as err:
        open_stage_file(path, SCHEMA, stage="speed", campaign="c")
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
    assert check_stage_file(path, SCHEMA) == err.value.problem


def test_a_file_of_another_job_stage_or_campaign_is_not_this_one(tmp_path):
    path = _write(tmp_path)
    assert check_stage_file(path, SCHEMA, "11bb") == "was written for config '00aa', not '11bb'"
    with pytest.raises(StageFileError, match="was written by stage 'speed', not 'timing'"):
        open_stage_file(path, stage="timing")
    with pytest.raises(StageFileError, match="belongs to campaign 'c', not 'd'"):
        open_stage_file(path, campaign="d")


def test_the_latest_plan_is_the_one_that_finished_last(tmp_path):
    assert plans.latest_plan_file(tmp_path, "c", "p") is None and plans.latest_plan_campaign(tmp_path) is None
    _write(tmp_path, stage="plan", config_hash="bbbb", finished_at="2026-02-01")
    _write(tmp_path, stage="plan", config_hash="aaaa", finished_at="2026-03-01")  # later, first by name
    _write(tmp_path, stage="plan", config_hash="cccc", finished_at="2026-01-01")
    _write(tmp_path, stage="plan", pair="q", config_hash="dddd", finished_at="2026-05-01")  # another pair
    _write(tmp_path, campaign="b", stage="plan", config_hash="eeee", finished_at="2026-04-01")
    assert plans.latest_plan_file(tmp_path, "c", "p").stem == "p-aaaa"
    assert plans.latest_plan_file(tmp_path, "b", "p").stem == "p-eeee"
    assert plans.latest_plan_campaign(tmp_path) == "c"
    rows = pd.DataFrame({"pair": ["p", "p", "q"], "config_hash": ["zz", "aa", "dd"],
                         "finished_at": ["2026-01-01", "2026-02-01", "2026-01-01"]})
    assert list(plans.latest_plan(rows).config_hash) == ["aa", "dd"]
