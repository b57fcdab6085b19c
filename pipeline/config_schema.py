"""The typed config schema: dataclasses registered with Hydra's ConfigStore, plus range checks.

Types are checked by Hydra while it composes the config (``max_new_tokens=abc`` never reaches
the code; ``sampling.do_sample=no`` is the boolean false, not the truthy string 'no'). Ranges and
choices are checked by :func:`check_config` before any model loads. Each field mirrors a key of the
YAML files in conf/ exactly: adding a key would change every job's config hash (``_target_`` keys
excepted: they name the class that builds an option, not what a job measures).

Groups whose options differ in shape (stage, drafter, k_policy) take their schema from a defaults
entry in each option's YAML (``- /schema/stage/speed@_here_``); a user's own option file may do the same.
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from pipeline.trees import EXAMPLES, parse_tree
from speclab.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.strategy import CostModelPolicy, FixedPolicy, HeuristicPolicy, default_of
from store.layout import NAME  # a campaign or pair name


class ConfigError(ValueError):
    """A config value outside what is allowed; its message is one line naming key, value and the allowed."""


@dataclass
class MlflowConf:
    enabled: bool = True
    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "speclab"


@dataclass
class PairConf:
    name: str = MISSING
    target: str = MISSING
    draft: str = MISSING
    dtype: str = "float32"
    draft_dtype: str = ""   # a draft model loaded by name: float32, bfloat16, float16 or int8; empty: dtype


@dataclass
class PromptsConf:
    file: str = "default.yaml"
    kinds: list[str] = field(default_factory=lambda: ["prose", "code", "structured"])
    per_kind: int = 0
    skip_per_kind: int = 0
    chat_template: str = "auto"  # auto | on | off (pipeline/chat.py); auto leaves the YAML texts raw


@dataclass
class SamplingConf:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


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
    max_ngram: int = default_of(PromptLookupDrafter, "max_ngram")
    min_ngram: int = default_of(PromptLookupDrafter, "min_ngram")


@dataclass
class HybridConf:
    _target_: str = _target(HybridDrafter)
    name: str = "hybrid"
    max_ngram: int = default_of(HybridDrafter, "max_ngram")
    min_ngram: int = default_of(HybridDrafter, "min_ngram")
    min_match: int = default_of(HybridDrafter, "min_match")


# A k-policy option is its spec (speclab/strategy.py: fields and defaults) and the spec's class.
@dataclass
class FixedKConf(FixedPolicy):
    _target_: str = _target(FixedPolicy)


@dataclass
class HeuristicKConf(HeuristicPolicy):
    _target_: str = _target(HeuristicPolicy)


@dataclass
class CostModelKConf(CostModelPolicy):
    _target_: str = _target(CostModelPolicy)


@dataclass
class StageBase:
    name: str = MISSING
    parts: list[str] = MISSING


@dataclass
class TimingStage(StageBase):
    pass_lengths: list[int] = field(default_factory=lambda: list(range(1, 10)))
    repeats: int = 20
    warmup: int = 3
    prompts_to_time: int = 1
    context_extra: list[int] = field(default_factory=lambda: [0])
    prefill: bool = False
    tree_nodes: list[int] = field(default_factory=list)  # the target's pass over 1 + n tree nodes (a 4D mask), per n


@dataclass
class KsStage(StageBase):
    ks: list[int] = field(default_factory=list)


@dataclass
class AcceptanceStage(KsStage):
    drafters: list[str] = field(default_factory=list)
    k_policies: list[str] = field(default_factory=list)
    policy_drafters: list[str] = field(default_factory=list)  # drafters of the k_policies runs ([]: the job's)
    replay: bool = True  # greedy: replay every configuration but the job's own from one plain generation
    trees: list[str] = field(default_factory=list)  # tree configurations run beside the chains (pipeline/trees.py)


@dataclass
class SpeedStage(KsStage):
    rounds: int = 1
    peer: bool = False
    peer_modes: list[str] = field(default_factory=lambda: ["matched"])
    k_policies: list[str] = field(default_factory=list)
    timing_repeats: int = 10
    timing_warmup: int = 2
    drafters: list[str] = field(default_factory=list)
    drafter_ks: list[int] = field(default_factory=list)
    recommended: bool = False
    best_fixed: bool = False
    block_timing_repeats: int = 0
    trees: list[str] = field(default_factory=list)  # tree arms, e.g. static:3-2-1-1 (pipeline/trees.py)


@dataclass
class PlanStage(TimingStage, AcceptanceStage):
    acceptance_ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8])
    bootstrap: int = 1000
    level: float = 0.9


@dataclass
class DivergenceStage(KsStage):
    rounds: int = 1
    tie_ulps: int = 4


@dataclass
class DistributionStage(StageBase):
    draws: int = 200000
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    top_tokens: int = 60
    alpha_level: float = 0.01
    no_power_acceptance: float = 0.98
    contexts: str = "prompt"
    contexts_per_prompt: int = 2
    power_sims: int = 200
    hf_conformance: bool = False
    hf_contexts: int = 1
    hf_runs: int = 2000


@dataclass
class BatchStage(StageBase):
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    ks: list[int] = field(default_factory=lambda: [2, 4])
    rounds: int = 1
    pass_lengths: list[int] = field(default_factory=lambda: list(range(1, 10)))
    timing_repeats: int = 5
    timing_warmup: int = 1


@dataclass
class AllStage(SpeedStage, TimingStage, DistributionStage):
    acceptance_ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    tie_ulps: int = 4


@dataclass
class TrustConf:
    """Job-time trust checks of speed, batch and timing jobs (pipeline/trust.py)."""
    max_drift: float = 1.25  # the analysis's drift limit (params.yaml drift.max_ratio)
    min_runs: int = 3  # runs per arm (repeats per timing) an interval needs


@dataclass
class SpeclabConf:
    pair: PairConf = MISSING
    prompts: PromptsConf = MISSING
    sampling: SamplingConf = MISSING
    stage: Any = MISSING
    drafter: Any = MISSING
    k_policy: Any = MISSING
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    trust: TrustConf = field(default_factory=TrustConf)
    device: str = "auto"
    seed: int = 0
    k: int = 4
    max_new_tokens: int = 48
    merge_prefill: bool = True
    round: int = 0
    rotation: int = 0
    threads: int = 0
    force: bool = False
    overwrite_published: bool = False
    campaign: str = "scratch"
    outputs_dir: str = MISSING


# The options of the drafter and k_policy groups, by name: their schemas, and the defaults of an extra
# arm (``stage.drafters``, ``stage.k_policies``) that names another option than the job's.
DRAFTERS = {conf.name: conf for conf in (ModelDrafterConf, PromptLookupConf, HybridConf)}
K_POLICIES = {conf.name: conf for conf in (FixedKConf, CostModelKConf, HeuristicKConf)}
EXTRA_POLICIES = tuple(name for name in K_POLICIES if name != FixedKConf.name)  # the adaptive ones (stage.k_policies)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
STAGE_SCHEMAS = {"timing": TimingStage, "acceptance": AcceptanceStage, "speed": SpeedStage, "divergence": DivergenceStage,
                 "distribution": DistributionStage, "all": AllStage, "batch": BatchStage, "plan": PlanStage}


def options(group: str, schemas: dict[str, type]) -> list[str]:
    """The group's options as the job's own: those with a schema here, and any option file a user added to
    conf/<group>/ (its ``_target_`` names the class, its keys are the constructor's arguments)."""
    return [*schemas, *sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if p.stem not in schemas)]


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="speclab_schema", node=SpeclabConf)
    for group, options in {"stage": STAGE_SCHEMAS, "drafter": DRAFTERS, "k_policy": K_POLICIES}.items():
        for name, node in options.items():
            cs.store(group=f"schema/{group}", name=name, node=node)


# ---- range and choice checks (run before any model loads) --------------------------------------

Check = tuple[Callable[[Any], bool], str]


def _int_at_least(n: int) -> Check:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= n), f"an integer >= {n}"


def _int_in(lo: int, hi: int, what: str = "") -> Check:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi), \
        what or f"an integer >= {lo} and <= {hi}"


def _ints_at_least(n: int, nonempty: bool = False, below: int | None = None) -> Check:
    what = (f"a {'non-empty ' if nonempty else ''}list of integers >= {n}" + (f" and < {below}" if below else "")
            + ", e.g. [1,2,4]")
    return (lambda v: isinstance(v, (list, ListConfig)) and (len(v) > 0 or not nonempty)
            and all(isinstance(x, int) and not isinstance(x, bool) and n <= x < (below or x + 1) for x in v)), what


def _number_in(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Check:
    def ok(v: Any) -> bool:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    return ok, f"a number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def _one_of(*choices: str) -> Check:
    return (lambda v: v in choices), f"one of {list(choices)}"


def _subset_of(*choices: str) -> Check:
    return (lambda v: isinstance(v, (list, ListConfig)) and all(x in choices for x in v)), \
        f"a list drawn from {list(choices)}"


def _positive_or_null() -> Check:
    return (lambda v: v is None or (isinstance(v, (int, float)) and v > 0)), "null (measure it) or a number > 0"


def _tree_specs(v: Any) -> bool:
    if not isinstance(v, (list, ListConfig)):
        return False
    try:
        [parse_tree(x) for x in v]
    except ValueError:
        return False
    return True


DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")
MAX_THREADS = 4 * (os.cpu_count() or 1)  # more only costs memory (threads=100000 ran out of it)
MAX_SEED = 2**63 - 1  # torch's generators take 64 bits; stages add small offsets to the seed

CHECKS: dict[str, Check] = {
    "k": _int_at_least(1),
    "max_new_tokens": _int_at_least(1),
    "seed": _int_in(0, MAX_SEED, f"an integer >= 0 and <= {MAX_SEED} (2**63 - 1)"),
    "round": _int_at_least(0),
    "rotation": _int_at_least(0),
    "threads": _int_in(0, MAX_THREADS, f"an integer >= 0 (0 keeps torch's default) and <= {MAX_THREADS} "
                                       "(4 per CPU core here)"),
    "device": (lambda v: bool(DEVICE.match(str(v))), "one of auto, cpu, cuda, cuda:N, mps"),
    "campaign": (lambda v: bool(NAME.match(str(v))),
                 "a name of letters, digits, '_', '.', '-' (up to 64 characters, no '/')"),
    "trust.max_drift": _number_in(1, float("inf"), lo_open=True),
    "trust.min_runs": _int_at_least(1),
    "mlflow.experiment": (lambda v: bool(str(v).strip()), "a non-empty experiment name"),
    "mlflow.tracking_uri": (lambda v: bool(str(v).strip()), "a tracking URI such as sqlite:///mlflow.db"),
    "pair.name": (lambda v: bool(NAME.match(str(v))), "a name of letters, digits, '_', '.', '-'"),
    "pair.target": (lambda v: bool(str(v).strip()), "a model name, Hugging Face id or local folder"),
    "pair.draft": (lambda v: bool(str(v).strip()), "a draft variant, model name, Hugging Face id or folder"),
    "pair.dtype": _one_of("float32", "bfloat16", "float16"),
    "pair.draft_dtype": _one_of("", "float32", "bfloat16", "float16", "int8"),
    "prompts.file": (lambda v: bool(str(v).strip()), "a prompt file name or path"),
    "prompts.kinds": (lambda v: isinstance(v, (list, ListConfig)) and len(v) > 0 and all(str(x).strip() for x in v),
                      "a non-empty list of prompt kinds, e.g. [prose,code]"),
    "prompts.per_kind": (_int_at_least(0)[0], "an integer >= 0 (0: every prompt of each kind)"),
    "prompts.skip_per_kind": (_int_at_least(0)[0], "an integer >= 0 (prompts of each kind to leave out first)"),
    "prompts.chat_template": (_one_of("auto", "on", "off")[0],
                              "one of ['auto', 'on', 'off'] (in a YAML file quote on and off: YAML reads them as booleans)"),
    "sampling.top_k": (_int_at_least(0)[0], "an integer >= 0 (0: no top-k filter)"),
    "sampling.top_p": _number_in(0, 1, lo_open=True),
    "drafter.name": ((lambda v: v in options("drafter", DRAFTERS)), f"one of {options('drafter', DRAFTERS)}"),
    "drafter.min_match": _int_at_least(1),
    "drafter.max_ngram": _int_at_least(1),
    "drafter.min_ngram": _int_at_least(1),
    "k_policy.name": ((lambda v: v in options("k_policy", K_POLICIES)), f"one of {options('k_policy', K_POLICIES)}"),
    "k_policy.k_min": (_int_at_least(0)[0], "an integer >= 0 (0: the cost model may stop speculating; heuristic: >= 1)"),
    "k_policy.probe_every": _int_at_least(1),
    "k_policy.k_max": _int_at_least(1),
    "k_policy.decay": _number_in(0, 1, lo_open=True, hi_open=True),
    "k_policy.alpha0": _number_in(0, 1, lo_open=True, hi_open=True),
    "k_policy.prior_weight": _number_in(0, float("inf"), hi_open=True),
    "k_policy.c_draft": _positive_or_null(),
    "k_policy.c_verify": _positive_or_null(),
    "k_policy.estimator": _one_of("iid", "positions"),
    "k_policy.condition_on": _one_of("none", "match"),
    "k_policy.free_k_min": ((lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)),
                            "null (the same as k_min) or an integer >= 0"),
    "stage.ks": _ints_at_least(1),
    "stage.batch_sizes": _ints_at_least(1, nonempty=True),
    "stage.acceptance_ks": _ints_at_least(1, nonempty=True),
    "stage.pass_lengths": _ints_at_least(1, nonempty=True),
    "stage.repeats": _int_at_least(1),
    "stage.warmup": _int_at_least(0),
    "stage.prompts_to_time": _int_at_least(1),
    "stage.rounds": _int_at_least(1),
    "stage.k_policies": _subset_of(*EXTRA_POLICIES),
    "stage.drafters": _subset_of(*DRAFTERS),
    "stage.policy_drafters": _subset_of(*DRAFTERS),
    "stage.drafter_ks": _ints_at_least(1),
    "stage.context_extra": _ints_at_least(0, nonempty=True),
    "stage.tree_nodes": _ints_at_least(1),
    "stage.trees": (_tree_specs, f"a list of tree specs, e.g. [{EXAMPLES}]"),
    "stage.bootstrap": _int_at_least(100),
    "stage.level": _number_in(0, 1, lo_open=True, hi_open=True),
    "stage.peer_modes": _subset_of("matched", "default", "lookup"),
    "stage.timing_repeats": _int_at_least(1),
    "stage.block_timing_repeats": (_int_at_least(0)[0], "an integer >= 0 (0: no step timing in each block)"),
    "stage.timing_warmup": _int_at_least(0),
    "stage.tie_ulps": _int_at_least(0),
    "stage.draws": _int_at_least(100),
    "stage.seeds": _ints_at_least(0, nonempty=True, below=2**31),  # an int32 column
    "stage.top_tokens": _int_at_least(1),
    "stage.alpha_level": _number_in(0, 1, lo_open=True, hi_open=True),
    "stage.no_power_acceptance": _number_in(0, 1, lo_open=True),
    "stage.contexts": _one_of("prompt", "max_tv"),
    "stage.contexts_per_prompt": _int_at_least(1),
    "stage.power_sims": _int_at_least(1),
    "stage.hf_contexts": _int_at_least(1),
    "stage.hf_runs": _int_at_least(1),
}

_ABSENT = object()
NOT_SCHEMA = ("hydra", "inputs")  # top-level keys besides the schema's: Hydra's own, what a job read (job_inputs)


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
    for group, schemas in (("stage", STAGE_SCHEMAS), ("drafter", DRAFTERS), ("k_policy", K_POLICIES)):
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
    shown = "VALUE" if value is None else str(value).lower() if isinstance(value, bool) else _plain(value)
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


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def check_config(cfg: DictConfig, stages: tuple[str, ...]) -> None:
    """Raise ConfigError (one line) for a key the schema does not know, or the first value outside its allowed
    range or choices."""
    check_keys(cfg)
    for key, (ok, allowed) in CHECKS.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and not ok(value):
            raise ConfigError(f"{key}={_plain(value)!r} is not allowed: use {allowed}")
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
