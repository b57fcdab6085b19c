"""One home per setting: the schema declares each key's default, check and hash-neutral value; conf/ says only
what differs from it, and the values pipeline and analysis share are defined once.

Composing needs no model: the whole test takes a few seconds.
"""
from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.config.schema import (CHECKS, HASH_NEUTRAL, SCHEMAS, STAGE_SCHEMAS, VOLATILE, RoundsStage, SpeclabConf,
                                    register)
from pipeline.config.settings import NOT_NEUTRAL, declarations, same_as, setting
from pipeline.config.value_checks import int_at_least
from store.legacy_arms import ACCEPTANCE_KEYS, FLAGS, NEUTRAL_KEYS
from store.shared_defaults import DRIFT_LIMIT, EXPERIMENT, TRACKING_URI

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
KEPT = {"defaults", "name", "parts"}  # what Hydra composition needs, whatever its value
GROUPS = ("stage", "drafter", "k_policy", "pair", "prompts", "sampling")


@pytest.fixture(scope="module")
def conf():
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield


def _raw(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def _default(schema: type, key: str) -> Any:
    f = schema.__dataclass_fields__[key]
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default


def _restated(raw: dict[str, Any], schema: type, prefix: str = "") -> list[str]:
    """The keys of ``raw`` whose value is ``schema``'s default (nested schemas followed)."""
    out = []
    for key, value in raw.items():
        if key in KEPT or key not in schema.__dataclass_fields__:
            continue
        default = _default(schema, key)
        if is_dataclass(default) and isinstance(value, dict):
            out += _restated(value, type(default), f"{prefix}{key}.")
        elif value == default:
            out.append(f"{prefix}{key}={value!r}")
    return out


OPTIONS = [f"{group}={p.stem}" for group in GROUPS for p in sorted((CONF / group).glob("*.yaml"))]


@pytest.mark.parametrize("option", OPTIONS)
def test_an_option_file_holds_only_what_differs_from_its_schema(conf, option):
    group, name = option.split("=")
    cfg = compose(config_name="config", overrides=[option, "outputs_dir=/tmp"])
    schema = OmegaConf.get_type(cfg[group])  # the option's own schema (a stage option names it in its defaults)
    restated = _restated(_raw(CONF / group / f"{name}.yaml"), schema)
    assert not restated, f"conf/{group}/{name}.yaml restates {schema.__name__}'s defaults: {restated}"


def test_the_main_config_holds_only_what_differs_from_its_schema():
    restated = _restated(_raw(CONF / "config.yaml"), SpeclabConf)
    assert not restated, f"conf/config.yaml restates SpeclabConf's defaults: {restated}"


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("sweep", sorted(p.stem for p in (CONF / "sweep").glob("*.yaml")))
def test_a_sweep_sets_only_what_its_stage_option_does_not(conf, sweep):
    raw = {k: v for k, v in _raw(CONF / "sweep" / f"{sweep}.yaml").items() if k not in ("defaults", "hydra")}
    stage = [d["override /stage"] for d in _raw(CONF / "sweep" / f"{sweep}.yaml")["defaults"]
             if isinstance(d, dict) and "override /stage" in d]
    cfg = compose(config_name="config", overrides=[f"stage={s}" for s in stage] + ["outputs_dir=/tmp"])
    same = [f"{key}={value!r}" for key, value in _leaves(raw).items()
            if OmegaConf.select(cfg, key) is not None and _plain(OmegaConf.select(cfg, key)) == value]
    assert not same, f"conf/sweep/{sweep}.yaml sets what composing without it gives: {same}"


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def test_every_checked_or_neutral_key_is_a_declared_field():
    declared = declarations(SCHEMAS)
    assert set(CHECKS) - {"drafter.name", "k_policy.name"} <= set(declared)
    flags = {f"stage.{k}" for k in NEUTRAL_KEYS}  # no live keys: their neutral values name stored jobs only
    assert set(HASH_NEUTRAL) - flags <= set(declared) and not flags & set(declared)
    for key, neutral in HASH_NEUTRAL.items():
        assert (NEUTRAL_KEYS[key.split(".", 1)[1]][0] if key in flags else declared[key]["neutral"]) == neutral.value \
            is not NOT_NEUTRAL


def test_where_and_how_a_job_ran_is_declared_in_the_schema_only():
    """The keys every job's hash and MLflow params leave out are fields declared ``volatile=True`` (``mlflow``: the
    whole section); the store keeps no list of its own, the pipeline hands it the schema's."""
    from store import identity

    # changing this set renames stored results (tests/test_config_hashes.py): a new volatile key is one never hashed
    assert set(VOLATILE) == {"force", "overwrite_published", "mlflow.", "outputs_dir", "threads", "campaign", "trust.strict"}
    declared = declarations(SCHEMAS)
    assert all(declared[key.rstrip(".")]["volatile"] for key in VOLATILE)
    assert not [name for name, value in vars(identity).items()
                if isinstance(value, tuple) and {"force", "campaign"} <= set(value)], "a second list in store.identity"
    flat = identity.flatten({"k": 4, "threads": 2, "mlflow": {"enabled": False, "later": 1}, "engine": {"threads": 2}})
    assert identity.measured(flat, VOLATILE) == {"k": 4, "engine.threads": 2}  # llama-server's threads are measured


def test_the_legacy_keys_are_no_live_keys_and_keep_their_neutral_values():
    """store/legacy_arms.py is the one home of the keys from before stage.arms (the speed flags, the acceptance and plan
    stages' keys) and their neutral values: no stage declares them (a recorded command's are translated into arms,
    pipeline/config/legacy_flags.py), and a stored job's hash still leaves each out at its neutral value."""
    for key in {**FLAGS, **ACCEPTANCE_KEYS}:
        assert not [name for name, schema in STAGE_SCHEMAS.items() if key in schema.__dataclass_fields__], key
    for key, default in FLAGS.items():
        neutral = HASH_NEUTRAL.get(f"stage.{key}")
        if key == "peer":
            assert neutral is None  # every speed job hashed stage.peer (store.legacy_arms.identity_stage)
        elif key not in ACCEPTANCE_KEYS:
            assert neutral is not None and neutral.value == default, f"stage.{key}: {neutral} != {default!r}"
    for key in ACCEPTANCE_KEYS:  # the acceptance stage hashed them from [] on; the speed stage k_policies always
        neutral = HASH_NEUTRAL[f"stage.{key}"]
        assert neutral.value == [] and neutral.only_for == (("acceptance",) if key == "k_policies" else None)


def test_a_key_stages_share_by_running_alike_is_declared_once():
    """``stage.rounds``: one field, inherited by every stage that runs its ks in rounds, never restated."""
    rounds = {name: schema.__dataclass_fields__["rounds"] for name, schema in STAGE_SCHEMAS.items()
              if "rounds" in schema.__dataclass_fields__}
    assert set(rounds) == {"speed", "divergence", "batch", "all", "load"}
    assert all(f is RoundsStage.__dataclass_fields__["rounds"] for f in rounds.values()), \
        [name for name, f in rounds.items() if f is not RoundsStage.__dataclass_fields__["rounds"]]


def test_a_key_two_schemas_declare_differently_is_refused():
    from dataclasses import dataclass

    @dataclass
    class A:
        n: int = setting(1, int_at_least(1), neutral=1)

    @dataclass
    class B:
        n: int = setting(2, int_at_least(1))  # another check object, no neutral value: not the same key

    @dataclass
    class C:
        n: int = same_as(A, "n", 3)

    assert declarations({"x.": (A, C)})["x.n"]["neutral"] == 1
    with pytest.raises(TypeError, match="x.n of B is declared unlike"):
        declarations({"x.": (A, B)})


def test_shared_values_are_defined_once(conf):
    """The drift limit, the MLflow store and the plan's level come from code the analysis reads too."""
    from analysis.tracking import tracking_settings
    from speclab.costs.planning import recommend
    from speclab.drafting.strategy import default_of

    cfg = compose(config_name="config", overrides=["stage=plan", "outputs_dir=/tmp"])
    assert cfg.trust.max_drift == DRIFT_LIMIT == HASH_NEUTRAL["trust.max_drift"].value
    assert (cfg.mlflow.tracking_uri, cfg.mlflow.experiment) == (TRACKING_URI, EXPERIMENT)
    assert cfg.stage.level == default_of(recommend, "level")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    analysis = tracking_settings(params)
    assert (analysis.uri, analysis.experiment) == (cfg.mlflow.tracking_uri, cfg.mlflow.experiment)
    assert params["drift"]["max_ratio"] == DRIFT_LIMIT  # the analysis's knob, at the job-time check's value


def test_no_conf_or_analysis_file_restates_a_shared_value():
    """Beside their homes (store/shared_defaults.py, the planner's signature) and params.yaml's drift knob."""
    files = [*CONF.rglob("*.yaml"), *(ROOT / "analysis").glob("*.py")]
    assert not [p.name for p in files if TRACKING_URI in p.read_text()]
    assert not [p.name for p in CONF.rglob("*.yaml") if str(DRIFT_LIMIT) in p.read_text()]
    assert not {"bootstrap", "level"} & set(_raw(CONF / "stage" / "plan.yaml"))
