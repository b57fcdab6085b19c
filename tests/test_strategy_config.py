"""Strategies from config: every drafter and k-policy option builds its class through Hydra's
``instantiate`` with the config's values, the library's constructor defaults are the config's, and a
new drafter needs one class and one option (no switch on names)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.config.schema import DRAFTERS, K_POLICIES, CostModelKConf, HeuristicKConf, HybridConf, PromptLookupConf
from pipeline.config.strategy_config import drafter_conf, make_drafter, policy_conf, policy_spec
from speclab.decoding.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.decoding.k_policy import ConditionedK, CostModelK, FixedK, HeuristicK
from speclab.drafting.strategy import CostModelPolicy, FixedPolicy, HeuristicPolicy, Prices, make_strategy
from speclab.costs.time_model import CostTable
from tests.pipeline_helpers import CONF, make_cfg

TABLE = CostTable({1: 0.5, 2: 0.6}, {k: 1.0 + 0.05 * k for k in range(1, 11)})


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF) / group).glob("*.yaml"))


def test_every_option_file_has_a_schema():
    assert options("drafter") == sorted(DRAFTERS) and options("k_policy") == sorted(K_POLICIES)


@pytest.mark.parametrize("overrides, cls, attrs", [
    (["drafter=model"], ModelDrafter, {}),
    (["drafter=prompt_lookup"], PromptLookupDrafter, {"max_ngram": 3, "min_ngram": 1}),
    (["drafter=prompt_lookup", "drafter.max_ngram=5", "drafter.min_ngram=2"], PromptLookupDrafter,
     {"max_ngram": 5, "min_ngram": 2}),
    (["drafter=hybrid", "drafter.max_ngram=4", "drafter.min_match=2"], HybridDrafter, {"min_match": 2}),
])
def test_drafter_options_build_their_class_with_the_config_values(tmp_path, tiny_pair, overrides, cls, attrs):
    cfg = make_cfg(tmp_path, *overrides)
    drafter = make_drafter(cfg.drafter, tiny_pair[1])
    assert type(drafter) is cls
    assert {key: getattr(drafter, key) for key in attrs} == attrs
    if cls is ModelDrafter:
        assert drafter.model is tiny_pair[1]
    if cls is HybridDrafter:
        assert drafter.model.model is tiny_pair[1] and drafter.lookup.max_ngram == cfg.drafter.max_ngram == 4


@pytest.mark.parametrize("overrides, spec_cls, policy_cls", [
    (["k_policy=fixed"], FixedPolicy, FixedK),
    (["k_policy=heuristic", "k_policy.k_max=7"], HeuristicPolicy, HeuristicK),
    (["k_policy=cost_model", "k_policy.decay=0.8", "k_policy.condition_on=none"], CostModelPolicy, CostModelK),
    (["k_policy=cost_model"], CostModelPolicy, ConditionedK),
])
def test_k_policy_options_build_their_spec_with_the_config_values(tmp_path, overrides, spec_cls, policy_cls):
    cfg = make_cfg(tmp_path, *overrides)
    spec = policy_spec(cfg.k_policy)
    assert type(spec) is spec_cls
    values = {k: v for k, v in OmegaConf.to_container(cfg.k_policy).items() if k != "_target_"}
    assert {k: getattr(spec, k) for k in values} == values
    policy = spec.build(3, Prices(TABLE, model_drafts=True))
    assert type(policy) is policy_cls
    if policy_cls is HeuristicK:
        assert (policy.k_start, policy.k_min, policy.k_max) == (3, 1, 7)
    if policy_cls is CostModelK:
        assert (policy.decay, policy.k_min, policy.k_max, policy.estimator) == (0.8, 0, 10, "positions")
        assert policy.table is TABLE  # the draft model pays for its proposals


def test_constructor_defaults_are_the_config_defaults(tmp_path):
    """One source: the schema's defaults are read from the library, and a composed option holds them."""
    def defaults(cls, names):
        params = inspect.signature(cls).parameters
        return {n: params[n].default for n in names}

    cost = ["k_min", "k_max", "decay", "alpha0", "prior_weight", "estimator", "probe_every"]
    assert defaults(CostModelK, cost) == defaults(CostModelPolicy, cost) == defaults(CostModelKConf, cost)
    assert defaults(CostModelK, ["decay", "estimator", "k_min"]) == {"decay": 0.9, "estimator": "positions", "k_min": 0}
    assert defaults(HeuristicK, ["k_min", "k_max"]) == defaults(HeuristicKConf, ["k_min", "k_max"])
    lookup = ["max_ngram", "min_ngram"]
    assert defaults(PromptLookupDrafter, lookup) == defaults(PromptLookupConf, lookup)
    hybrid = ["max_ngram", "min_ngram", "min_match"]
    assert defaults(HybridDrafter, hybrid) == defaults(HybridConf, hybrid)
    composed = make_cfg(tmp_path, "k_policy=cost_model").k_policy
    assert {n: composed[n] for n in cost} == defaults(CostModelK, cost)
    assert dict(make_cfg(tmp_path, "drafter=hybrid").drafter) == {**defaults(HybridDrafter, hybrid), "name": "hybrid",
                                                                  "_target_": "speclab.decoding.drafters.HybridDrafter"}


def test_an_extra_arm_takes_its_options_defaults(tmp_path):
    cfg = make_cfg(tmp_path, "drafter=hybrid", "drafter.max_ngram=5", "k_policy=heuristic", "k_policy.k_max=6")
    assert policy_spec(policy_conf(cfg, "cost_model")) == CostModelPolicy()
    assert policy_spec(policy_conf(cfg)) == HeuristicPolicy(k_max=6)
    lookup = drafter_conf(cfg, "prompt_lookup")  # the job drafter's n-gram sizes, lookup's own class
    assert (lookup._target_, lookup.max_ngram, lookup.min_ngram) == ("speclab.decoding.drafters.PromptLookupDrafter", 5, 1)
    assert drafter_conf(cfg) is cfg.drafter


class EveryOtherToken:
    """A drafter without a model, as a user might add one: proposes the token two back."""

    def __init__(self, gap: int = 2) -> None:
        self.gap = gap

    def start(self, ids, n_ctx):
        pass

    def propose(self, ids, length, k, sampling, generator):
        return ids[0, length - self.gap: length - self.gap + 1].repeat(k), None

    def rollback(self, valid_length):
        pass


def test_a_new_drafter_is_one_class_and_one_option(tiny_pair):
    from speclab.decoding.loop import plain_greedy, speculative_generate

    option = OmegaConf.create({"_target_": f"{__name__}.EveryOtherToken", "name": "every_other", "gap": 3})
    strategy = make_strategy(make_drafter(option, tiny_pair[1]), CostModelPolicy(), 2, TABLE)
    assert isinstance(strategy.drafter, EveryOtherToken) and strategy.drafter.gap == 3
    assert strategy.prices.free()  # no model: its proposals are priced free
    ids = torch.tensor([[5, 9, 5, 9, 5]])
    res = speculative_generate(tiny_pair[0], strategy.drafter, ids, 10, k=strategy.policy)
    assert res.tokens == plain_greedy(tiny_pair[0], ids, 10).tokens


def test_a_new_drafter_option_file_is_checked_and_built(tmp_path, monkeypatch, tiny_pair):
    """A user's option file with a ``_target_`` and no schema: the job's drafter, built with its keys."""
    import shutil

    from hydra import compose, initialize_config_dir

    import pipeline.config.schema as schema
    from store.layout import STAGES

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    option = f"_target_: {__name__}.EveryOtherToken\nname: every_other\ngap: 3\n"
    (conf / "drafter" / "every_other.yaml").write_text(option)
    monkeypatch.setattr(schema, "CONF_DIR", conf)
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["pair=tiny_random", "drafter=every_other",
                                                       f"outputs_dir={tmp_path}"])
    schema.check_config(cfg, STAGES)
    drafter = make_drafter(drafter_conf(cfg), tiny_pair[1])
    assert isinstance(drafter, EveryOtherToken) and drafter.gap == 3
    # Its file need not be in conf/: Hydra found it (any folder on its search path, tests/test_toy_drafter.py).
    monkeypatch.setattr(schema, "CONF_DIR", Path(CONF))
    schema.check_config(cfg, STAGES)
    # A shipped option's schema under another name is no option.
    with pytest.raises(schema.ConfigError, match="drafter.name='every_other' is not allowed"):
        schema.check_config(make_cfg(tmp_path, "drafter.name=every_other"), STAGES)


@pytest.mark.parametrize("overrides", [[], ["k_policy=cost_model", "drafter=hybrid"], ["stage=plan", "k_policy=heuristic"]])
def test_target_keys_name_no_job_and_no_param(tmp_path, overrides):
    """An option's class is not what a job measures: its hash and its MLflow params leave ``_target_`` out."""
    from pipeline.jobs.identity import config_hash
    from pipeline.jobs.identity import run_params

    cfg = make_cfg(tmp_path, *overrides)
    plain = OmegaConf.to_container(cfg)
    for group in ("drafter", "k_policy"):
        assert plain[group].pop("_target_")
    assert config_hash(OmegaConf.create(plain)) == config_hash(cfg)
    assert run_params(OmegaConf.create(plain)) == run_params(cfg)
