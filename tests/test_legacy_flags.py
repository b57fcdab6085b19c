"""The speed stage's flags from before stage.arms: no live key (not in --help), a recorded command that sets them runs
as the arms they ran with the hash they named (tests/test_migration.py recomposes every committed one), a bad value
is one line, and a key the acceptance stage still reads as its own passes as it is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.legacy_flags import command_line, compose_recorded, translated
from pipeline.config.schema import ConfigError, register
from pipeline.jobs.arms import stage_entries
from pipeline.jobs.identity import config_hash
from speclab.specs.arms import ArmEntry
from store.legacy_arms import FLAGS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose_job():
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=["pair=tiny_random", *overrides,
                                                                          f"outputs_dir={ROOT / 'outputs'}"])


def test_flags_run_as_the_arms_they_ran_with_the_hash_they_named(compose_job):
    given, flags = translated(["stage=speed", "stage.peer=true", "stage.peer_modes=[default]", "stage.drafter_ks=[2]",
                               "stage.drafters=[prompt_lookup]"], compose_job)
    assert given == ["stage=speed", "stage.arms=[{method:'speculative'},{method:'speculative',"
                                    "drafter:'prompt_lookup',k_policy:'fixed',ks:[2]},{method:'hf_default'}]"]
    cfg = compose_recorded(["stage=speed", "stage.peer=true", "stage.peer_modes=[default]", "stage.drafter_ks=[2]",
                            "stage.drafters=[prompt_lookup]"], compose_job)
    assert stage_entries(cfg) == [ArmEntry(), ArmEntry(drafter="prompt_lookup", k_policy="fixed", ks=[2]),
                                  ArmEntry("hf_default")]
    # the same arms written as arms name the same job: a flag list the arms express hashes as those flags
    assert config_hash(cfg) == config_hash(compose_job(given))
    assert flags["peer"] is True and flags["drafter_ks"] == [2]


def test_a_flag_that_changes_no_arm_still_names_the_job(compose_job):
    """peer=false keeps the preset's peer modes in the hash, though no peer arm runs: the arms alone lose them."""
    recorded = ["+sweep=check_plan", "stage.peer=false"]
    cfg = compose_recorded(recorded, compose_job)
    given, _ = translated(recorded, compose_job)
    assert cfg.recorded_flags.peer_modes == ["default"] and config_hash(cfg) != config_hash(compose_job(given))


def test_an_acceptance_key_runs_as_the_arms_it_ran_in_the_acceptance_dialect(compose_job):
    """stage.trees on the acceptance stage added a tree beside the job's chains (not the speed flag's meaning)."""
    given, keys = translated(["stage=acceptance", "stage.trees=[static:2-1]"], compose_job)
    assert given == ["stage=acceptance", "stage.arms=[{method:'speculative'},{method:'speculative',tree:'static:2-1'}]"]
    assert keys == {"drafters": [], "k_policies": [], "policy_drafters": [], "trees": ["static:2-1"]}
    cfg = compose_recorded(["stage=acceptance", "stage.trees=[static:2-1]"], compose_job)
    assert config_hash(cfg) == config_hash(compose_job(given))  # the keys the list expresses: the same job


def test_the_plan_keys_run_as_their_arms_and_keep_the_plan_hash(compose_job):
    """A recorded plan with stage.policy_drafters=[] ran the cost-model k with the job's drafter only."""
    given, keys = translated(["stage=plan", "stage.policy_drafters=[]"], compose_job)
    assert given[-1] == ("stage.arms=[{method:'speculative',drafter:'model'},{method:'speculative',drafter:"
                         "'prompt_lookup'},{method:'speculative',drafter:'hybrid'},{method:'speculative',"
                         "k_policy:'cost_model'}]")
    assert keys["policy_drafters"] == [] and keys["k_policies"] == ["cost_model"]
    assert config_hash(compose_recorded(["stage=plan", "stage.policy_drafters=[]"], compose_job)) != config_hash(
        compose_job(["stage=plan"]))


@pytest.mark.parametrize("override, said", [
    ("stage.peer=sometimes", "stage.peer='sometimes' is not allowed: use true or false"),
    ("stage.peer_modes=[fast]", "stage.peer_modes=['fast'] is not allowed: use a list drawn from"),
    ("stage.drafter_ks=[0]", "stage.drafter_ks=[0] is not allowed: use a list of integers >= 1"),
    ("stage.recommended=true,false", "sweeps a flag from before stage.arms: sweep stage.arms instead"),
])
def test_a_bad_flag_is_one_line(compose_job, override, said):
    with pytest.raises(ConfigError) as err:
        translated(["stage=speed", override], compose_job)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_no_flag_is_a_live_key(compose_job):
    cfg = compose_job(["stage=speed"])
    assert not set(FLAGS) & set(cfg.stage)
    assert command_line(["stage=speed", "k=2"]) == (["stage=speed", "k=2"], {})


@pytest.mark.slow
def test_help_lists_no_flag_and_the_command_line_translates_them(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "pipeline.run", *a], cwd=ROOT, capture_output=True,  # noqa: E731
                                    text=True, env=env, timeout=300)
    shown = run("--help").stdout
    stage = shown[shown.index("\nstage:\n"):shown.index("\ndrafter:\n")]
    assert not [f for f in FLAGS if f"\n  {f}:" in stage]
    res = run("--cfg", "job", "pair=tiny_random", "stage=speed", "stage.recommended=true")
    assert res.returncode == 0, res.stderr
    assert "stage.recommended=true: flags from before stage.arms, run as stage.arms=[{method:'speculative'}," \
           "{method:'recommended'}]" in res.stdout
