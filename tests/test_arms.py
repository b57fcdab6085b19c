"""Arms as data (speclab/specs/arms.py): entries expand into the arms a speed job runs, stored rows read back into the
same arms with the same labels, one place says whether an arm runs the draft model, and the flags that came
before translate both ways without changing a job's identity (store/legacy_arms.py)."""
from __future__ import annotations

import pytest

from speclab.specs.arms import (PLAIN, RECOMMENDED, Arm, ArmEntry, Job, drafter_looks_up, drafter_runs_model, entry,
                          expand_all, needs)
from store.legacy_arms import FLAGS, arms_from_flags, effective_arms, flags_from_arms, identity_stage

JOB = Job(drafter="model", k_policy="fixed", ks=(2, 4), k=4)


def test_the_job_own_entry_runs_its_drafter_and_policy_at_the_stage_ks():
    assert expand_all([{}], JOB) == [PLAIN, Arm("speculative", 2, "fixed", "model"), Arm("speculative", 4, "fixed", "model")]


def test_each_kind_of_entry_expands_to_its_arms_in_order():
    entries = [{}, {"k_policy": "cost_model"}, {"drafter": "prompt_lookup", "k_policy": "fixed", "ks": [3]},
               {"tree": "static:2-1"}, {"method": "recommended"}, {"method": "hf_default"},
               {"method": "hf_lookup"}, {"method": "best_fixed"}]
    arms = expand_all(entries, JOB, best=("hybrid", 6))
    assert arms == [PLAIN, Arm("speculative", 2, "fixed", "model"), Arm("speculative", 4, "fixed", "model"),
                    Arm("speculative", 4, "cost_model", "model"),  # an adaptive policy starts at the top-level k
                    Arm("speculative", 3, "fixed", "prompt_lookup"),
                    Arm("speculative", 2, "fixed", "tree:static:2-1"), RECOMMENDED,
                    Arm("hf_default", None, "library_default", "model"),
                    Arm("hf_lookup", 2, "fixed", "prompt_lookup"), Arm("hf_lookup", 4, "fixed", "prompt_lookup"),
                    Arm("speculative", 6, "fixed", "hybrid")]
    assert needs(entries, "best_fixed") and needs(entries, "recommended") and not needs([{}], "recommended")


def test_an_arm_listed_twice_runs_once():
    assert expand_all([{}, {"ks": [4]}], JOB) == expand_all([{}], JOB)


@pytest.mark.parametrize("bad,word", [({"method": "fast"}, "method='fast'"), ({"ks": []}, "ks=[]"),
                                      ({"ks": [0]}, "ks=[0]"), ({"colour": 1}, "colour"),
                                      ({"tree": "oak:1"}, "oak")])
def test_a_bad_entry_is_one_line_naming_it(bad, word):
    with pytest.raises(ValueError) as err:
        entry(bad)
    assert word in str(err.value) and "\n" not in str(err.value)


def test_best_fixed_needs_the_campaigns_best():
    with pytest.raises(ValueError, match="best fixed"):
        expand_all([{"method": "best_fixed"}], JOB)


def test_one_place_says_which_arms_run_the_draft_model():
    assert drafter_runs_model("model") and drafter_runs_model("hybrid") and not drafter_runs_model("prompt_lookup")
    assert drafter_runs_model("tree:static:2-1") and not drafter_runs_model("tree:lookup:4-6")
    assert drafter_looks_up("hybrid") and drafter_looks_up("tree:lookup:4-6") and not drafter_looks_up("model")
    assert Arm("hf_default", None, "library_default", "model").runs_draft_model
    assert not Arm("hf_lookup", 4, "fixed", "prompt_lookup").runs_draft_model and not PLAIN.runs_draft_model


def test_a_stored_row_reads_back_into_its_arm_and_labels():
    row = {"arm": "recommended", "k": 0, "k_policy": "cost_model", "drafter": "prompt_lookup"}
    arm = Arm.from_row(row)
    assert arm == Arm("recommended", None, "cost_model", "prompt_lookup") and arm.columns()["k"] == 0
    assert arm.label == "prompt lookup cost-model k (plan)" and arm.key == "recommended prompt_lookup cost_model"
    assert Arm("speculative", 4, "fixed", "model").label == "draft model k=4"
    assert Arm("recommended", None, "none", "none").label == "plain decoding (plan)"  # the plan chose no speculation
    assert Arm("speculative", 4, "fixed", "model").key == "speculative model k=4"
    assert Arm("speculative", 3, "fixed", "tree:static:2-1-1").label == "tree static:2-1-1"
    assert Arm("hf_default", None, "library_default", "model").label == "transformers default"


def test_run_names_give_k_only_where_the_arm_runs_it():
    assert Arm("speculative", 4, "fixed", "model").run_name("code") == "speculative k4 code"
    assert Arm("speculative", 4, "heuristic", "model").run_name("all") == "speculative from-k4 heuristic all"
    assert Arm("recommended", 4, "cost_model", "prompt_lookup").run_name("prose") == \
        "recommended cost_model prompt_lookup prose"
    assert Arm("hf_default", None, "library_default", "model").run_name("all") == "hf_default library_default all"
    assert Arm("speculative", 3, "fixed", "tree:static:2-1-1").run_name("all") == "speculative tree:static:2-1-1 all"
    # llama.cpp's k is the most it drafts: the same settings at two k are two runs, named apart
    names = {Arm("speculative", k, policy, drafter, "llama_cpp").run_name("all")
             for k, policy, drafter in [(4, "p_min=0.75", "model"), (8, "p_min=0.75", "model"),
                                        (4, "size_n=3", "ngram-simple"), (8, "size_n=3", "ngram-simple")]}
    assert names == {"speculative k4 p_min=0.75 all", "speculative k8 p_min=0.75 all",
                     "speculative k4 size_n=3 ngram-simple all", "speculative k8 size_n=3 ngram-simple all"}
    assert Arm("speculative", None, "library_default", "model", "llama_cpp").run_name("all") == \
        "speculative library_default all"


# ---- the flags that came before ----------------------------------------------------------------------------
PRESET_FLAGS = [
    {},  # every speed job's default
    {"k_policies": ["cost_model"], "drafters": ["prompt_lookup", "hybrid"], "drafter_ks": [1, 2, 3],
     "recommended": True, "peer": True, "peer_modes": ["default"]},  # check_plan
    {"best_fixed": True, "recommended": True, "peer": True, "peer_modes": ["default"]},  # confirm_plan
    {"drafters": ["prompt_lookup"], "drafter_ks": [4], "trees": ["static:2-1-1", "lookup:4-6"]},  # trees
    {"peer": True, "peer_modes": ["matched", "default", "lookup"]},
]


@pytest.mark.parametrize("flags", PRESET_FLAGS)
def test_flags_translate_to_arms_and_back(flags):
    arms = arms_from_flags(flags, "model", "fixed")
    assert flags_from_arms(arms, "model", "fixed") == {**FLAGS, **flags}


def test_a_list_flags_cannot_express_keeps_its_own_identity():
    arms = [{"drafter": "prompt_lookup", "ks": [2]}, {}]  # the job's own arms second: no flags ran that order
    assert flags_from_arms(arms, "model", "fixed") is None
    stage = identity_stage({"name": "speed", "race": False, "arms": arms}, "model", "fixed")
    assert "arms" in stage and not set(FLAGS) & set(stage)


def test_the_hash_sees_the_flags_of_an_expressible_list():
    stage = identity_stage({"name": "speed", "race": False, "ks": [4], "arms": [{}]}, "model", "fixed")
    assert stage == {"name": "speed", "race": False, "ks": [4], **FLAGS}


def test_a_recorded_flag_applies_to_the_presets_list_and_keeps_the_flags_identity():
    preset = arms_from_flags(PRESET_FLAGS[1], "model", "fixed")
    stage = {"name": "speed", "race": False, "arms": preset, **dict.fromkeys(FLAGS), "peer": False}
    assert not any(a["method"] == "hf_default" for a in effective_arms(stage, "model", "fixed"))
    # the peer's mode was hashed though the peer did not run: the hash still sees it
    assert identity_stage(stage, "model", "fixed") == {"name": "speed", "race": False, **FLAGS, **PRESET_FLAGS[1],
                                                        "peer": False}
    stage = {"name": "speed", "race": False, "arms": preset, **dict.fromkeys(FLAGS), "drafter_ks": [2, 4]}
    assert [a["ks"] for a in effective_arms(stage, "model", "fixed") if a["drafter"]] == [[2, 4], [2, 4]]
    assert effective_arms({"race": False, "arms": preset, **dict.fromkeys(FLAGS)}, "model", "fixed") == preset


def test_flags_on_a_list_they_cannot_express_are_refused():
    with pytest.raises(ValueError, match="cannot take the flags"):
        effective_arms({"race": False, "arms": [{"ks": [2]}, {}], "peer": True}, "model", "fixed")


def test_entries_default_to_the_job():
    assert ArmEntry() == entry({})


def test_a_tree_shape_is_data_or_its_short_spec_and_both_are_one_arm_and_one_job():
    data = {"family": "static", "branching": [3, 2, 1, 1]}
    assert expand_all([{"tree": data}], JOB) == expand_all([{"tree": "static:3-2-1-1"}], JOB)
    assert expand_all([{"tree": {"family": "dynamic", "depth": 4}}], JOB)[1].drafter == "tree:dynamic:4-4-16"
    as_data = identity_stage({"name": "speed", "arms": [{}, {"tree": data}]}, "model", "fixed")
    assert as_data == identity_stage({"name": "speed", "arms": [{}, {"tree": "static:3-2-1-1"}]}, "model", "fixed")
    with pytest.raises(ValueError, match="takes"):
        entry({"tree": {"family": "static", "depth": 3}})


# -- one dialect: every stage's and every engine's arms are stage.arms entries, built by Hydra's instantiate ----------
@pytest.mark.parametrize("engine, stage, want", [
    ("speclab", "speed", [ArmEntry()]),
    ("speclab", "acceptance", [ArmEntry()]),
    ("speclab", "plan", [ArmEntry(drafter=d, k_policy=p) for p in (None, "cost_model")
                         for d in ("model", "prompt_lookup", "hybrid")]),
    ("llama_cpp", "speed", [ArmEntry(), ArmEntry(drafter="ngram-simple", default=True)]),
    ("llama_cpp", "plan", [ArmEntry(), ArmEntry(drafter="ngram-simple", default=True)]),  # plan.yaml's are speclab's
])
def test_each_stage_builds_its_arm_entries_by_instantiate(tmp_path, monkeypatch, engine, stage, want):
    import pipeline.jobs.arms as arms
    from pipeline_helpers import make_cfg

    built = []
    real = arms.instantiate
    monkeypatch.setattr(arms, "instantiate", lambda conf, **kw: built.append(conf["_target_"]) or real(conf, **kw))
    got = arms.stage_entries(make_cfg(tmp_path, f"engine={engine}", f"stage={stage}"))
    assert got == want and all(isinstance(e, ArmEntry) for e in got)
    assert built == [arms.ARM_ENTRY] * len(want)  # each one built by Hydra, none parsed by hand


def test_a_llama_entry_and_a_speclab_entry_are_one_dataclass(tmp_path):
    from pipeline.jobs.arms import stage_entries
    from pipeline_helpers import make_cfg

    arms = "[{drafter:model,ks:[4,8],settings:{p_min:0.75}},{method:recommended}]"
    got = stage_entries(make_cfg(tmp_path, "engine=llama_cpp", "stage=speed", f"stage.arms={arms}"))
    assert got == [ArmEntry(drafter="model", ks=[4, 8], settings={"p_min": 0.75}), ArmEntry(method="recommended")]
    assert stage_entries(make_cfg(tmp_path, "stage=timing")) == []  # a stage without arms


def test_a_llama_job_hashes_its_arms_as_its_engine_arms_did():
    """Before stage.arms llama.cpp's configurations were engine.arms; the stage kept its own keys (stage.plan's preset
    though unread) and the plan's choice (store/legacy_arms.py identity_tree)."""
    from store.legacy_arms import identity_tree

    tree = {"engine": {"name": "llama_cpp"}, "drafter": {"name": "model"}, "k_policy": {"name": "fixed"},
            "stage": {"name": "speed", "race": False,
                      "arms": [{"drafter": "model", "ks": [4]}, {"drafter": "ngram-simple", "default": True},
                               {"method": "recommended"}]}}
    out = identity_tree(tree)
    assert out["engine"]["arms"] == [{"drafter": "model", "ks": [4]}, {"drafter": "ngram-simple", "default": True}]
    assert out["stage"] == {"name": "speed", "race": False, **FLAGS, "recommended": True}
    timing = identity_tree({**tree, "stage": {"name": "timing"}}, engine_arms=[{}])
    assert timing["engine"]["arms"] == [{}] and timing["stage"] == {"name": "timing"}
    plan = identity_tree({**tree, "stage": {"name": "plan", "arms": [{}]}}, stage_preset=[{"drafter": "hybrid"}])
    assert plan["stage"] == {"name": "plan", "drafters": ["hybrid"], "k_policies": [], "policy_drafters": [],
                             "trees": []}
    speclab = identity_tree({**tree, "engine": {"name": "speclab"}})
    assert "arms" not in speclab["engine"] and "arms" in speclab["stage"]  # a list the flags cannot express


def test_the_acceptance_keys_translate_to_arms_and_back():
    from store.legacy_arms import arms_from_keys, keys_from_arms

    keys = {"drafters": ["model", "prompt_lookup"], "k_policies": ["cost_model"], "policy_drafters": ["hybrid"],
            "trees": ["static:2-1"]}
    arms = arms_from_keys(keys, "model", "fixed")
    assert [(a["drafter"], a["k_policy"], a["tree"]) for a in arms] == [
        ("model", None, None), ("prompt_lookup", None, None), ("hybrid", "cost_model", None), (None, None, "static:2-1")]
    assert keys_from_arms(arms, "model", "fixed") == keys
    assert keys_from_arms([{}], "model", "fixed") == {"drafters": [], "k_policies": [], "policy_drafters": [], "trees": []}
    assert keys_from_arms([{"ks": [2]}], "model", "fixed") is None  # ks of its own: no keys ran that
