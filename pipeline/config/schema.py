"""The typed config schema: dataclasses registered with Hydra's ConfigStore. Each config key has one home, its field.

A field declared with ``setting`` (pipeline/config/settings.py) holds the key's type, default, allowed range (the words
after ``use`` in its one-line error), for a key added after results were stored its hash-neutral value, whether it
says where or how a job ran rather than what it measures (``volatile``) and the one engine that reads it
(``engine``); ``CHECKS``, ``HASH_NEUTRAL``, ``VOLATILE`` (both handed to ``store.identity``) and the engine checks'
keys (pipeline/engines/option_checks.py) are walked out of these fields. Types are checked by Hydra while it composes
(``max_new_tokens=abc`` never reaches the code); ranges by :func:`check_config` before any model loads. The
YAML files in conf/ hold only what differs from these defaults (tests/test_settings_home.py).

Adding a stage option is one edit and its test: a field on the stage's schema class below,
``name: type = setting(default, check=..., doc="...")``, with ``neutral=`` the value that measures what jobs
measured before it existed (or every stored job's config hash changes; ``neutral_for=`` to restrict that to
some stage names). A key several stage schemas share (they flatten into one ``stage.`` namespace) is declared
once, on a schema they inherit where they run alike (``RoundsStage.rounds``), or restated elsewhere with
``same_as(Owner, "name", default)``; two schemas declaring one key
differently fail at import. Set a non-default value in conf/stage/<option>.yaml only where that option
differs. The test: the check's error in tests/test_bad_input_table.py and the option's effect in its stage's
test; tests/test_migration.py then proves every published hash unchanged.

Groups whose options differ in shape (stage, drafter, k_policy) take their schema from a defaults entry in each
option's YAML (``- /schema/stage/speed@_here_``); a user's own option file may do the same.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from pipeline.config.settings import arm_hashed, checks, neutral_table, same_as, section, setting, volatile_keys
from pipeline.config.engine_conf import engine_confs
from pipeline.config.value_checks import (MAX_THREADS, Check, int_at_least, int_in, ints_at_least, matches, nonblank, number_in, one_of,
                                   positive_or_null, unset_or, worded)
from speclab.specs.arms import ArmEntry
from speclab.decoding.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.costs.planning import recommend
from speclab.drafting.strategy import CostModelPolicy, FixedPolicy, HeuristicPolicy, default_of
from store.layout import NAME  # a campaign or pair name
from store.identity import Neutral
from store.legacy_arms import NEUTRAL_KEYS, RECORDED
from store.shared_defaults import DRIFT_LIMIT, EXPERIMENT, TRACKING_URI


class ConfigError(ValueError):
    """A config value outside what is allowed; its message is one line naming key, value and the allowed."""


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")
MAX_SEED = 2**63 - 1  # torch's generators take 64 bits; stages add small offsets to the seed
NAME_WORDS = "a name of letters, digits, '_', '.', '-'"
# engine=SPECLAB: a key only speclab's own loop reads (every engine's configurations are stage.arms entries);
# pipeline/engines/option_checks.py refuses it set under another engine.
SPECLAB, LLAMA_CPP = "speclab", "llama_cpp"


@dataclass
class MlflowConf:
    enabled: bool = setting(True, doc="false: no MLflow run (the Parquet files are the record either way)")
    tracking_uri: str = setting(TRACKING_URI, nonblank(f"a tracking URI such as {TRACKING_URI}"),
                                doc="relative to the directory you run from (the repo root)")
    experiment: str = setting(EXPERIMENT, nonblank("a non-empty experiment name"))


@dataclass
class PairConf:
    name: str = setting(MISSING, matches(NAME, NAME_WORDS))
    target: str = setting(MISSING, nonblank("a model name, Hugging Face id or local folder"))
    draft: str = setting(MISSING, nonblank("a draft variant, model name, Hugging Face id or folder"))
    dtype: str = setting("float32", one_of("float32", "bfloat16", "float16"))
    draft_dtype: str = setting("", one_of("", "float32", "bfloat16", "float16", "int8"), neutral="",
                               doc="a draft model loaded by name: float32, bfloat16, float16 or int8; empty: dtype")


@dataclass
class PromptsConf:
    file: str = setting("default.yaml", nonblank("a prompt file name or path"),
                        doc="a file of pipeline/prompts/ (YAML or Spec-Bench JSONL), or a path")
    kinds: list[str] = setting(["prose", "code", "structured"],
                               ((lambda v: isinstance(v, (list, ListConfig)) and len(v) > 0
                                 and all(str(x).strip() for x in v)),
                                "a non-empty list of prompt kinds, e.g. [prose,code]"), doc="which kinds to run")
    per_kind: int = setting(0, worded(int_at_least(0), "an integer >= 0 (0: every prompt of each kind)"),
                            doc="0: every prompt of each kind; n: the first n of each kind")
    skip_per_kind: int = setting(
        0, worded(int_at_least(0), "an integer >= 0 (prompts of each kind to leave out first)"), neutral=0,
        doc="leave out the first n of each kind (the planner's sample), then per_kind")
    chat_template: str = setting(
        "auto", worded(one_of("auto", "on", "off"),
                       "one of ['auto', 'on', 'off'] (in a YAML file quote on and off: YAML reads them as booleans)"),
        neutral="auto",  # auto runs the YAML sets raw, as every stored result was; JSONL workloads are newer
        doc="auto: JSONL questions through the tokenizer's chat template where it has one, YAML texts (beginnings "
            "to continue) raw; on | off: every prompt (pipeline/prompts/chat.py)")


@dataclass
class SamplingConf:
    do_sample: bool = setting(False, doc="false: greedy decoding")
    temperature: float = setting(1.0, doc="when sampling: > 0 (check_config)")
    top_k: int = setting(0, worded(int_at_least(0), "an integer >= 0 (0: no top-k filter)"))
    top_p: float = setting(1.0, number_in(0, 1, lo_open=True), doc="1.0: no nucleus filter")


def _target(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# A drafter option names its class in ``_target_`` and takes the constructor's defaults.
@dataclass
class ModelDrafterConf:
    _target_: str = _target(ModelDrafter)
    name: str = "model"


@dataclass
class PromptLookupConf:
    _target_: str = _target(PromptLookupDrafter)
    name: str = "prompt_lookup"
    max_ngram: int = setting(default_of(PromptLookupDrafter, "max_ngram"), int_at_least(1),
                             doc="the longest n-gram looked up (in the prompt and the text so far)")
    min_ngram: int = setting(default_of(PromptLookupDrafter, "min_ngram"), int_at_least(1),
                             doc="the shortest n-gram looked up")


@dataclass
class HybridConf:
    _target_: str = _target(HybridDrafter)
    name: str = "hybrid"
    max_ngram: int = same_as(PromptLookupConf, "max_ngram", default_of(HybridDrafter, "max_ngram"))
    min_ngram: int = same_as(PromptLookupConf, "min_ngram", default_of(HybridDrafter, "min_ngram"))
    min_match: int = setting(default_of(HybridDrafter, "min_match"), int_at_least(1),
                             doc="fewer lookup tokens than this let the draft model propose instead")


# A k-policy option is its spec (speclab/drafting/strategy.py: fields and defaults) and the spec's class; the schema
# restates the spec's fields to give each its check, reading its default from the spec.
@dataclass
class FixedKConf(FixedPolicy):
    _target_: str = _target(FixedPolicy)


@dataclass
class CostModelKConf(CostModelPolicy):
    k_min: int = setting(CostModelPolicy.k_min, worded(int_at_least(0), "an integer >= 0 (0: the cost model may stop "
                                                                         "speculating; heuristic: >= 1)"),
                         doc="0: a plain target step is a choice too, taken where no k >= 1 is priced above it "
                             "(1: always speculate, as in older results)")
    k_max: int = setting(CostModelPolicy.k_max, int_at_least(1), doc="the most proposals an iteration makes")
    decay: float = setting(CostModelPolicy.decay, number_in(0, 1, lo_open=True, hi_open=True),
                           doc="weight of the previous iteration's evidence (0.7 with estimator iid in older results)")
    alpha0: float = setting(CostModelPolicy.alpha0, number_in(0, 1, lo_open=True, hi_open=True),
                            doc="the prior: prior_weight checks at acceptance rate alpha0")
    prior_weight: float = setting(CostModelPolicy.prior_weight, number_in(0, float("inf"), hi_open=True),
                                  doc="the prior's weight, in checks")
    c_draft: Optional[float] = setting(CostModelPolicy.c_draft, positive_or_null(),
                                       doc="null: measure the price table; with c_verify: the chapter's formula")
    c_verify: Optional[float] = setting(CostModelPolicy.c_verify, positive_or_null(),
                                        doc="null: measure the price table; with c_draft: the chapter's formula")
    estimator: str = setting(CostModelPolicy.estimator, one_of("iid", "positions"), neutral="iid",
                             doc="positions: one acceptance rate per draft position; iid: one alpha (the chapter's "
                                 "model)")
    probe_every: int = setting(CostModelPolicy.probe_every, int_at_least(1),
                               doc="with k_min 0: plain steps in a row before one drafted iteration refreshes the "
                                   "estimate")
    condition_on: str = setting(CostModelPolicy.condition_on, one_of("none", "match"), neutral="none",
                                doc="match: one estimate per label the drafter gives before proposing (prompt lookup "
                                    "and the hybrid: the matched n-gram's length, or \"model\"); none: one estimate "
                                    "(older results)")
    free_k_min: Optional[int] = setting(
        CostModelPolicy.free_k_min,
        ((lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)),
         "null (the same as k_min) or an integer >= 0"),
        neutral=None, arm_hashed=True,
        doc="k_min where proposals cost nothing (prompt lookup; a hybrid's lookup iterations); null: k_min "
            "(older results)")
    _target_: str = _target(CostModelPolicy)


@dataclass
class HeuristicKConf(HeuristicPolicy):
    k_min: int = same_as(CostModelKConf, "k_min", HeuristicPolicy.k_min)
    k_max: int = same_as(CostModelKConf, "k_max", HeuristicPolicy.k_max)
    _target_: str = _target(HeuristicPolicy)


# The options of the drafter and k_policy groups, by name: their schemas, and the defaults of an arm entry that names
# another option than the job's.
DRAFTERS = {conf.name: conf for conf in (ModelDrafterConf, PromptLookupConf, HybridConf)}
K_POLICIES = {conf.name: conf for conf in (FixedKConf, CostModelKConf, HeuristicKConf)}


def options(group: str, schemas: dict[str, type]) -> list[str]:
    """The group's options as the job's own: those with a schema here, and any option file a user added to
    conf/<group>/ (its ``_target_`` names the class, its keys are the constructor's arguments)."""
    return [*schemas, *sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if p.stem not in schemas)]


@dataclass
class StageBase:
    name: str = MISSING
    parts: list[str] = MISSING


@dataclass
class TimingStage(StageBase):
    pass_lengths: list[int] = setting(list(range(1, 10)), ints_at_least(1, nonempty=True),
                                      doc="the pass lengths timed: each model's pass over n new tokens")
    repeats: int = setting(20, int_at_least(1), doc="timed passes of each length")
    warmup: int = setting(3, int_at_least(0), doc="untimed passes before them")
    prompts_to_time: int = setting(1, int_at_least(1), doc="the first n prompts of the selection")
    time_per_kind: int = setting(0, worded(int_at_least(0), "an integer >= 0 (0: prompts_to_time)"), neutral=0,
                                 doc="n > 0: time the first n prompts of each kind instead (each kind's context "
                                     "lengths, at a cost that does not grow with the sample)")
    context_extra: list[int] = setting([0], ints_at_least(0, nonempty=True), neutral=[0],
                                       doc="pass times after the prompt and after each of these many more tokens "
                                           "(the context grows)")
    prefill: bool = setting(False, neutral=False, engine=SPECLAB, doc="also time both models' prefill of the prompt")
    tree_nodes: list[int] = setting([], ints_at_least(1), neutral=[], engine=SPECLAB,
                                    doc="the target's pass over 1 + n tree nodes (a 4D mask), per n")


@dataclass
class KsStage(StageBase):
    ks: list[int] = setting([], ints_at_least(1), doc="k values run in this job; empty: the top-level k")


@dataclass
class RoundsStage(KsStage):
    """The stages that run their ks over the prompts in rounds (speed, divergence, batch): one ``stage.rounds``."""
    rounds: int = setting(1, int_at_least(1), doc="in-job rounds over the prompts (speed with race or precision: "
                                                  "the most rounds, the budget)")


def _arm_entries(v: Any) -> bool:
    """Null or a list of mappings: each entry is then built (and checked, one line naming what is wrong) by Hydra's
    ``instantiate`` into speclab's ArmEntry, and its names by the job's engine (pipeline/jobs/arms.py, Engine.check)."""
    return v is None or (isinstance(v, (list, ListConfig)) and all(isinstance(e, (dict, DictConfig)) for e in v))


ARMS_EXAMPLE = "[{},{k_policy:cost_model},{drafter:prompt_lookup,k_policy:fixed,ks:[4]},{tree:'static:3-2-1-1'}," \
               "{method:recommended},{method:hf_default}]"
ARMS_CHECK = (_arm_entries, f"null or a list of arm entries {{method, drafter, k_policy, ks, tree, settings, default}}, "
                            f"e.g. {ARMS_EXAMPLE} (docs/pipeline.md#arms)")


def arms_setting(doc: str) -> Any:
    """``stage.arms``, declared once for the stages that run arms (acceptance, plan, speed and those built on them)."""
    return setting(None, ARMS_CHECK, neutral=None,
                   doc=doc + " (speclab/specs/arms.py ArmEntry, built by Hydra's instantiate); null: the engine's own "
                             "(Engine.default_arms: speclab, the job's drafter at each of ks)")


@dataclass
class AcceptanceStage(KsStage):
    arms: Optional[list[ArmEntry]] = arms_setting("the configurations run, in order (speculative entries only)")
    replay: bool = setting(True, neutral=False,
                           doc="greedy: replay every configuration but the job's own from one plain generation")


@dataclass
class SpeedStage(RoundsStage):
    race: bool = setting(True, neutral=False,
                         doc="drop an arm from a kind's blocks once it is clearly slower than the leader, corrected "
                             "for every look and rival (speclab/stats/racing.py); stage.rounds is then the budget")
    precision: Optional[float] = setting(0.05, unset_or(number_in(0, float("inf"), lo_open=True, hi_open=True)),
                                         neutral=None,
                                         doc="stop a kind's blocks once every arm in its race has a speed-up interval "
                                             "of at most this half-width; stage.rounds is then the budget")
    budget_minutes: Optional[float] = setting(None, unset_or(number_in(0, float("inf"), lo_open=True, hi_open=True)),
                                              neutral=None,
                                              doc="with race or precision: start no block after this many minutes")
    interval_level: float = setting(0.95, number_in(0.5, 1, hi_open=True), neutral=0.95,
                                    doc="level of the speed-up intervals, the precision stop and the race's drops")
    arms: Optional[list[ArmEntry]] = same_as(AcceptanceStage, "arms")
    timing_repeats: int = setting(10, int_at_least(1), doc="step timings before and after the runs")
    timing_warmup: int = setting(2, int_at_least(0), doc="untimed steps before them")
    block_timing_repeats: int = setting(0, worded(int_at_least(0), "an integer >= 0 (0: no step timing in each block)"),
                                        neutral=0,
                                        doc="> 0: time a target and a draft step before each block's runs (the "
                                            "machine's state then)")


@dataclass
class PlanStage(TimingStage, AcceptanceStage):
    acceptance_ks: list[int] = setting([1, 2, 3, 4, 5, 6, 7, 8], ints_at_least(1, nonempty=True),
                                       doc="k values of the acceptance part")
    bootstrap: int = setting(1000, int_at_least(100),
                             doc="not read: a prediction's interval over the prompts is distribution-free "
                                 "(speclab.stats.intervals.median_ci); kept so that stored plans keep their config hash")
    level: float = setting(default_of(recommend, "level"), number_in(0, 1, lo_open=True, hi_open=True),
                           doc="interval level; a kind overrides the robust choice when its held-out gain passes a t test at it")
    # The sample grows a kind at a time (greedy reference and replay only; the timing part runs once) until the kind
    # is settled or a budget is spent (pipeline/stages/plan_sample.py); unset: the sample as prompts.per_kind chose it.
    sample_precision: Optional[float] = setting(
        0.05, unset_or(number_in(0, 1, lo_open=True, hi_open=True)), neutral=None,
        doc="add prompts of a kind until its recommendation is, at the plan's level corrected for its rivals and "
            "looks, at most this much below every other configuration (speclab/costs/sample_rule.py); null: never add")
    sample_max_prompts: int = setting(8, int_at_least(2), neutral=8, doc="with sample_precision: the most prompts a kind")
    sample_budget_minutes: float = setting(20.0, number_in(0, float("inf"), lo_open=True, hi_open=True), neutral=20.0,
                                           doc="with sample_precision: add no prompt that would end the plan's "
                                               "sample after this many minutes (from the acceptance part's start)")


@dataclass
class DivergenceStage(RoundsStage):
    tie_ulps: int = setting(4, int_at_least(0), engine=SPECLAB,
                            doc="a gap within this many units in the last place is a near-tie")
    tie_nats: float = setting(0.5, number_in(0, float("inf")), neutral=0.5, engine=LLAMA_CPP,
                              doc="engine=llama_cpp: a gap log(p1/p2) of its top-2 probabilities within this many "
                                  "nats is a near-tie (docs/pipeline.md#engines)")


@dataclass
class DistributionStage(StageBase):
    draws: int = setting(200000, int_at_least(100), doc="first-token draws per rule, context and seed")
    seeds: list[int] = setting([0, 1, 2], ints_at_least(0, nonempty=True, below=2**31), doc="an int32 column")
    top_tokens: int = setting(60, int_at_least(1), doc="the chi-square's bins: the target's top tokens")
    alpha_level: float = setting(0.01, number_in(0, 1, lo_open=True, hi_open=True), doc="the test's level")
    no_power_acceptance: float = setting(0.98, number_in(0, 1, lo_open=True),
                                         doc="contexts with sum(min(p, q)) above this cannot tell the rules apart")
    contexts: str = setting("prompt", one_of("prompt", "max_tv"),
                            doc="prompt: right after each prompt; max_tv: where target and draft disagree most")
    contexts_per_prompt: int = setting(2, int_at_least(1),
                                       doc="with max_tv: positions per prompt (along its greedy continuation)")
    power_sims: int = setting(200, int_at_least(1), doc="simulations for the power against the wrong rules")
    hf_conformance: bool = setting(False,
                                   doc="also test transformers' generate(assistant_model=..., do_sample=True)")
    hf_contexts: int = setting(1, int_at_least(1), doc="contexts tested that way (each costs hf_runs generate calls)")
    hf_runs: int = setting(2000, int_at_least(1))
    engine_runs: int = setting(1000, int_at_least(1), neutral=1000,
                               doc="an engine that samples outside speclab's loop (vLLM): requests per context and "
                                   "configuration through its own speculative sampling")


@dataclass
class BatchStage(RoundsStage):
    batch_sizes: list[int] = setting([1, 2, 4, 8], ints_at_least(1, nonempty=True))
    ks: list[int] = same_as(KsStage, "ks", [2, 4])
    pass_lengths: list[int] = same_as(TimingStage, "pass_lengths")
    timing_repeats: int = same_as(SpeedStage, "timing_repeats", 5)
    timing_warmup: int = same_as(SpeedStage, "timing_warmup", 1)


@dataclass
class LoadStage(RoundsStage):
    concurrency: list[int] = setting([1, 2, 4, 8], ints_at_least(1, nonempty=True),
                                     doc="the loads: closed-loop clients, each sending its next request when its last "
                                         "is answered")
    requests: int = setting(4, int_at_least(1),
                            doc="requests a block sends at each load (at least twice the load: every client sends two)")
    arms: Optional[list[ArmEntry]] = same_as(AcceptanceStage, "arms")
    timing_repeats: int = same_as(SpeedStage, "timing_repeats", 5)
    timing_warmup: int = same_as(SpeedStage, "timing_warmup", 1)
    interval_level: float = same_as(SpeedStage, "interval_level")
    speed_check: bool = setting(True, doc="at load 1, the plain requests also run one at a time through the speed "
                                          "stage's run, right after the block (its tokens/s beside the load's)")
    # The passes a load's steps carry, timed on one sequence: load x (k + 1) tokens (a check of k proposals for each
    # request) and load x 1 (a plain step), the costs analysis/load.py predicts the gains from.
    pass_lengths: list[int] = same_as(TimingStage, "pass_lengths", [1, 2, 4, 5, 8, 10, 20, 40])
    repeats: int = same_as(TimingStage, "repeats", 5)
    warmup: int = same_as(TimingStage, "warmup", 1)
    context_extra: list[int] = same_as(TimingStage, "context_extra")


@dataclass
class AllStage(SpeedStage, TimingStage, DistributionStage):
    acceptance_ks: list[int] = same_as(PlanStage, "acceptance_ks", [1, 2, 4, 8])
    tie_ulps: int = same_as(DivergenceStage, "tie_ulps")
    tie_nats: float = same_as(DivergenceStage, "tie_nats")


@dataclass
class TrustConf:
    """Job-time trust checks of speed, batch and timing jobs (pipeline/jobs/trust.py): a failed one is a console
    warning, a line in the MLflow description, the tag trust=<checks> and the Parquet columns trust /
    trust_detail. Checks of the measurement, not part of it: at their first values a job keeps its identity."""
    # neutral: the limit every job ran under before the key existed, whatever the default becomes
    max_drift: float = setting(DRIFT_LIMIT, number_in(1, float("inf"), lo_open=True), neutral=1.25,
                               doc="before/after step times differing by more than this factor")
    min_runs: int = setting(3, int_at_least(1), neutral=3,
                            doc="fewer runs per arm (repeats per timing) than this give no interval")
    strict: bool = setting(False, volatile=True,
                           doc="a plan refuses to recommend from an untrusted timing or acceptance part (one line)")


ENGINES = engine_confs()  # each engine package's settings (engines/<name>/conf.py), by the name its rows carry


@dataclass
class SpeclabConf:
    pair: PairConf = MISSING
    prompts: PromptsConf = MISSING
    sampling: SamplingConf = MISSING
    stage: Any = MISSING
    drafter: Any = MISSING
    k_policy: Any = MISSING
    engine: Any = MISSING
    mlflow: MlflowConf = section(MlflowConf, volatile=True)  # where a job's run is filed, not what it measures
    trust: TrustConf = section(TrustConf)
    device: str = setting("auto", matches(DEVICE, "one of auto, cpu, cuda, cuda:N, mps"), doc="auto | cpu | cuda[:N]")
    seed: int = setting(0, int_in(0, MAX_SEED, f"an integer >= 0 and <= {MAX_SEED} (2**63 - 1)"))
    k: int = setting(4, int_at_least(1), doc="proposals per iteration")
    max_new_tokens: int = setting(48, int_at_least(1))
    merge_prefill: bool = setting(True, neutral=False,
                                  doc="the prompt rides in the first draft call and verification pass (as "
                                      "transformers' assisted generation does); false: both models prefill it apart "
                                      "first (one pass more each)")
    round: int = setting(0, int_at_least(0),
                         doc="a label for repeated runs of the same config (sweep it for rounds in separate jobs)")
    rotation: int = setting(0, int_at_least(0), doc="offset of the arm order in the speed stage's rotation")
    threads: int = setting(0, int_in(0, MAX_THREADS, f"an integer >= 0 (0 keeps torch's default) and <= {MAX_THREADS} "
                                                     "(4 per CPU core here)"), volatile=True,
                           doc="torch intra-op threads; 0 keeps torch's default (1 per job in parallel sweeps)")
    force: bool = setting(False, volatile=True, doc="rerun a job whose output for this exact config already exists")
    overwrite_published: bool = setting(False, volatile=True,
                                        doc="opens nothing: kept so recorded commands compose; true on a published "
                                            "campaign is refused (python -m store.extend adds jobs)")
    # The campaign says where a result is filed, not what it measures: one measurement keeps one hash across campaigns.
    campaign: str = setting("scratch", matches(NAME, f"{NAME_WORDS} (up to 64 characters, no '/')"), volatile=True,
                            doc="results go to outputs/campaigns/<campaign>/; dvc repro publishes the campaigns in "
                                "params.yaml")
    outputs_dir: str = setting(MISSING, volatile=True,
                               doc="where campaigns/ is (conf/config.yaml: the repo's outputs/)")


STAGE_SCHEMAS = {"timing": TimingStage, "acceptance": AcceptanceStage, "speed": SpeedStage, "divergence": DivergenceStage,
                 "distribution": DistributionStage, "all": AllStage, "batch": BatchStage, "plan": PlanStage,
                 "load": LoadStage}
# Every schema by the prefix of its keys, in the order the checks run.
SCHEMAS: dict[str, tuple[type, ...]] = {
    "": (SpeclabConf,), "trust.": (TrustConf,), "mlflow.": (MlflowConf,), "pair.": (PairConf,),
    "prompts.": (PromptsConf,), "sampling.": (SamplingConf,), "drafter.": tuple(DRAFTERS.values()),
    "k_policy.": tuple(K_POLICIES.values()), "stage.": tuple(STAGE_SCHEMAS.values()),
    "engine.": tuple(ENGINES.values())}
# A group's option is a file as much as a schema: its name is checked against both.
OPTION_CHECKS: dict[str, Check] = {
    f"{group}.name": ((lambda v, group=group, schemas=schemas: v in options(group, schemas)),
                      f"one of {options(group, schemas)}")
    for group, schemas in (("drafter", DRAFTERS), ("k_policy", K_POLICIES), ("engine", ENGINES))}
CHECKS: dict[str, Check] = checks(SCHEMAS, first=OPTION_CHECKS)
# The keys a job's config hash leaves out at their neutral value: the schema's, and the keys from before stage.arms,
# which are no live keys but still name stored jobs (store/legacy_arms.py: their hash, at their neutral values).
HASH_NEUTRAL = {**{f"stage.{k}": Neutral(v, only) for k, (v, only) in NEUTRAL_KEYS.items()}, **neutral_table(SCHEMAS)}
VOLATILE = volatile_keys(SCHEMAS)  # the keys (and prefixes) left out of every job's hash and MLflow params
COST_MODEL_ARM_KEYS = arm_hashed(CostModelKConf)  # pipeline/jobs/inputs.py


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="speclab_schema", node=SpeclabConf)
    for group, options in {"stage": STAGE_SCHEMAS, "drafter": DRAFTERS, "k_policy": K_POLICIES,
                           "engine": ENGINES}.items():
        for name, node in options.items():
            cs.store(group=f"schema/{group}", name=name, node=node)


_ABSENT = object()
# Top-level keys besides the schema's: Hydra's own, what a job read (job_inputs), a recorded command's flags from before
# stage.arms (pipeline/config/legacy_flags.py).
NOT_SCHEMA = ("hydra", "inputs", RECORDED)


def _schema_keys(typ: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(typ):
        out.append(prefix + f.name)
        sub = f.default_factory() if callable(getattr(f, "default_factory", None)) else None
        if is_dataclass(sub):
            out += _schema_keys(type(sub), f"{prefix}{f.name}.")
    return out


def schema_keys() -> list[str]:
    """Every key the schema knows, dotted (a group's keys over all its options)."""
    keys = [k for k in _schema_keys(SpeclabConf) if k not in ("pair", "prompts", "sampling")]
    for group, typ in (("pair", PairConf), ("prompts", PromptsConf), ("sampling", SamplingConf)):
        keys += _schema_keys(typ, f"{group}.")
    for group, schemas in (("stage", STAGE_SCHEMAS), ("drafter", DRAFTERS), ("k_policy", K_POLICIES),
                           ("engine", ENGINES)):
        keys += sorted({k for typ in schemas.values() for k in _schema_keys(typ, f"{group}.")} - {f"{group}._target_"})
    return keys


def config_groups() -> dict[str, bool]:
    """The config groups (folders of conf/), each with whether choosing it needs a leading ``+`` (not in the
    main config's defaults: sweep, launcher)."""
    own = {f.name for f in fields(SpeclabConf)}
    return {p.name: p.name not in own for p in sorted(CONF_DIR.iterdir()) if p.is_dir() and p.name != "hydra"}


def close_matches(word: str, candidates: list[str]) -> list[str]:
    """Candidates whose last part is spelled like ``word``'s (stage.round ~ round, stage.rounds), closest first."""
    last = word.rsplit(".", 1)[-1]
    score = {c: difflib.SequenceMatcher(None, last, c.rsplit(".", 1)[-1]).ratio() for c in candidates}
    return sorted((c for c in candidates if score[c] >= 0.8), key=lambda c: -score[c])[:4]


def did_you_mean(key: str, value: Any = None, known: list[str] | None = None) -> str:
    """`` did you mean a=1 or +sweep=speed?`` for a key the config does not have ('' when nothing is close)."""
    shown = "VALUE" if value is None else str(value).lower() if isinstance(value, bool) else plain(value)
    groups = config_groups()
    hints = [f"{'+' * groups[g]}{g}={shown}" for g in close_matches(key, list(groups))] if "." not in key else []
    hints += [f"{k}={shown}" for k in close_matches(key, known or schema_keys()) if k not in groups]
    return f" did you mean {' or '.join(hints)}?" if hints else ""


def unknown_key_line(key: str, value: Any = None, known: list[str] | None = None) -> str:
    return (f"{key} is not a config key here:{did_you_mean(key, value, known)} New keys are not allowed "
            f"(they would be ignored); `python -m pipeline.run --cfg job` lists the keys")


def _walk(node: DictConfig, prefix: str = "") -> tuple[list[str], list[tuple[str, Any]]]:
    """The dotted keys of ``node`` its schemas know, and those they do not (with their values)."""
    typ = OmegaConf.get_type(node)
    names = {f.name for f in fields(typ)} if is_dataclass(typ) else None  # a user's option without a schema: any
    known, unknown = [], []
    for key in node:
        dotted, child = f"{prefix}{key}", node._get_node(key)
        if names is not None and key not in names and not (not prefix and key in NOT_SCHEMA):
            unknown.append((dotted, child._value() if not isinstance(child, DictConfig) else None))
            continue
        known.append(dotted)
        if isinstance(child, DictConfig) and not (not prefix and key in NOT_SCHEMA):
            sub_known, sub_unknown = _walk(child, f"{dotted}.")
            known, unknown = known + sub_known, unknown + sub_unknown
    return known, unknown


def check_keys(cfg: DictConfig) -> None:
    """A key the schema does not know (``+sweeps=speed``, ``+stage.round=3``) would be ignored: refuse it."""
    known, unknown = _walk(cfg)
    if unknown:
        key, value = unknown[0]
        raise ConfigError(unknown_key_line(key, value, known))


def plain(value: Any) -> Any:
    """A config value as plain data (a node resolved; anything else as it is)."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def own_drafter(cfg: DictConfig) -> str | None:
    """The name of the job's drafter option where it is a user's option file without a schema (anywhere on Hydra's
    search path: Hydra found the file when it composed ``drafter=NAME``), else None."""
    node = cfg.get("drafter")
    if not isinstance(node, DictConfig) or OmegaConf.get_type(node) in DRAFTERS.values() or "name" not in node:
        return None
    return str(node.name)


def check_config(cfg: DictConfig, stages: tuple[str, ...]) -> None:
    """Raise ConfigError (one line) for a key the schema does not know, or the first value outside its allowed
    range or choices."""
    check_keys(cfg)
    own = own_drafter(cfg)
    for key, (ok, allowed) in CHECKS.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if own is not None and key == "drafter.name" and value == own:
            continue  # a user's option file, found by Hydra (its arms' names: the engine checks them)
        if value is not _ABSENT and not ok(value):
            raise ConfigError(f"{key}={plain(value)!r} is not allowed: use {allowed}")
    parts = list(cfg.stage.parts)
    unknown = [p for p in parts if p not in stages]
    if not parts or unknown:
        raise ConfigError(f"stage.parts={unknown or parts} is not allowed: use a non-empty list drawn from {list(stages)}")
    if cfg.k_policy.name == "heuristic" and int(cfg.k_policy.k_min) < 1:
        raise ConfigError(f"k_policy.k_min={cfg.k_policy.k_min!r} is not allowed with k_policy=heuristic: use an integer >= 1")
    for lo, hi in (("drafter.min_ngram", "drafter.max_ngram"), ("k_policy.k_min", "k_policy.k_max"),
                   ("k_policy.free_k_min", "k_policy.k_max")):
        a, b = OmegaConf.select(cfg, lo), OmegaConf.select(cfg, hi)
        if a is not None and b is not None and a > b:
            raise ConfigError(f"{lo}={a} with {hi}={b} is not allowed: use {lo} <= {hi}")
    s = cfg.sampling
    if s.do_sample and not (isinstance(s.temperature, (int, float)) and s.temperature > 0):
        raise ConfigError(f"sampling.temperature={s.temperature!r} is not allowed when sampling: use a number > 0")
