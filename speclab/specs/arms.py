"""A compared configuration ("arm") as data: what a speed job runs beside plain decoding, and how a stored row
names it.

An arm is a method (our loop, the plan's recommendation, transformers' generate), a drafter, a k or a k policy,
and the engine that runs it. The config lists arm *entries* (``stage.arms``), each expanded here into arms:
an entry that names several ks is several arms. Plain decoding is every job's baseline and always its first arm.

Torch-free: the pipeline builds and runs arms from this, the analysis reads stored rows back into them
(``Arm.from_row``) and names them with the same labels. Adding a kind of arm is one ``METHODS`` entry (or
one field of ``ArmEntry``) here and its test.
Same concept, other floors: ``pipeline/jobs/arms.py``, each engine's ``engines/<name>/arms.py``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from speclab.specs.tree_shapes import FAMILIES, PREFIX as TREE_PREFIX, is_tree, parse_tree

# Sentinels of the stored columns: an arm without a drafter or k policy of ours (plain decoding), the plan's
# choice before a prompt's kind picks it, the library's own schedule of proposals.
NONE, PLAN, LIBRARY_DEFAULT = "none", "plan", "library_default"


@dataclass(frozen=True)
class Method:
    """How an arm runs: by our loop (``ours``), by transformers' ``generate`` (``peer_mode``), or by whatever
    the plan chose for the prompt's kind (``from_plan``)."""

    name: str
    ours: bool = False
    peer_mode: str = ""      # hf_generate's mode: matched (our k, no threshold), default (its settings), lookup
    from_plan: bool = False
    reader_name: str = ""    # the report's name where the drafter does not say it


METHODS = {m.name: m for m in (
    Method("plain"),
    Method("speculative", ours=True),
    Method("recommended", ours=True, from_plan=True),
    Method("hf_assisted", peer_mode="matched"),
    Method("hf_default", peer_mode="default", reader_name="transformers default"),
    Method("hf_lookup", peer_mode="lookup"),
)}
PEER_METHODS = {m.peer_mode: name for name, m in METHODS.items() if m.peer_mode}
# Readers' names of the engines (the ``engine`` column), drafters and adaptive policies (the report's labels).
ENGINE_NAMES = {"speclab": "speclab", "llama_cpp": "llama.cpp", "vllm": "vLLM"}
DRAFTER_NAMES = {"model": "draft model", "prompt_lookup": "prompt lookup", "hybrid": "hybrid"}
POLICY_NAMES = {"cost_model": "cost-model k", "heuristic": "heuristic k"}
# What each drafter option's class declares (speclab/decoding/drafters.py Drafter): whether it runs the pair's draft
# model and whether it looks up n-grams of the text every iteration. A job declares its own options here from their
# classes (pipeline/config/strategy_config.py declare_drafters); the shipped options stand here too, for stored rows
# read with no config at hand (tests/test_toy_drafter.py checks their classes say the same).
DRAFTER_PARTS: dict[str, tuple[bool, bool]] = {"model": (True, False), "prompt_lookup": (False, True),
                                               "hybrid": (True, True)}


@dataclass(frozen=True)
class Arm:
    """One compared configuration. ``k`` is a fixed k, where an adaptive policy starts, a tree's depth, or None
    where the arm has no k of ours (plain decoding, the library's schedule, the plan's arm before a kind picks
    its configuration). Stored rows write no k as 0."""

    method: str
    k: int | None = None
    k_policy: str = NONE
    drafter: str = NONE
    engine: str = "speclab"

    @property
    def ours(self) -> bool:
        """Run by our loop with a drafter and k policy of the config (not plain, not a peer, not the plan's yet)."""
        return METHODS[self.method].ours and self.drafter not in (NONE, PLAN)

    @property
    def is_tree(self) -> bool:
        return is_tree(self.drafter)

    @property
    def peer_mode(self) -> str:
        return METHODS[self.method].peer_mode

    @property
    def runs_draft_model(self) -> bool:
        """Whether the arm's proposals come from the pair's draft model (the one place that says so)."""
        return drafter_runs_model(self.drafter) or self.peer_mode in ("matched", "default")

    def columns(self) -> dict[str, Any]:
        return {"k": self.k or 0, "k_policy": self.k_policy, "drafter": self.drafter}

    @classmethod
    def from_row(cls, row: Any) -> Arm:
        """The arm of a stored speed row (any object or mapping with arm, k, k_policy, drafter; engine where the
        row has one, else speclab's loop)."""
        get = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name)
        has = (lambda name: name in row) if isinstance(row, Mapping) else (lambda name: hasattr(row, name))
        engine = str(get("engine")) if has("engine") and get("engine") == get("engine") else "speclab"
        return cls(str(get("arm")), int(get("k")) or None, str(get("k_policy")), str(get("drafter")), engine)

    @property
    def key(self) -> str:
        """A compact label: ``speculative model k=4``, ``speculative prompt_lookup cost_model``."""
        k = f" k={self.k or 0}" if self.k_policy == "fixed" else ""
        policy = "" if self.k_policy in ("fixed", NONE) else f" {self.k_policy}"
        return f"{self.method} {self.drafter}{policy}{k}"

    @property
    def label(self) -> str:
        """A reader's label: ``draft model k=4``, ``prompt lookup cost-model k``, ``tree static:2-1-1``,
        ``transformers default``; the planner's arm adds ``(plan)``."""
        reader = METHODS[self.method].reader_name
        if self.engine != "speclab":  # another engine's own type, the most it drafts, its other settings
            name = ENGINE_NAMES.get(self.engine, self.engine)
            text = DRAFTER_NAMES.get(self.drafter, self.drafter) + (f" k={self.k}" if self.k else "") + (
                f" ({name} defaults)" if self.k_policy == LIBRARY_DEFAULT
                else "" if self.k_policy in ("fixed", NONE) else f" {self.k_policy}")
        elif self.is_tree:
            text = "tree " + self.drafter.removeprefix(TREE_PREFIX)
        elif self.drafter == NONE and self.method != "plain":
            text = PLAIN_CHOICE  # the plan chose not to speculate
        elif reader:
            text = reader
        else:
            text = DRAFTER_NAMES.get(self.drafter, self.drafter) + (
                f" k={self.k or 0}" if self.k_policy == "fixed" else " " + POLICY_NAMES.get(self.k_policy, self.k_policy))
        return text + (" (plan)" if METHODS[self.method].from_plan else "")

    def run_name(self, kind: str) -> str:
        """The MLflow name of this arm's child run for prompts of ``kind``: what varies first."""
        if self.is_tree:
            return f"{self.method} {self.drafter} {kind}"
        # An adaptive policy's k is where it starts (the heuristic) or nothing at all (the cost model, the
        # library's schedule): naming it "k4" would file it beside fixed k = 4 in MLflow's compare view.
        k = self.k or 0
        ks = [f"k{k}"] if self.k_policy == "fixed" else [f"from-k{k}"] if self.k_policy == "heuristic" else []
        if self.engine != "speclab":  # another engine's k is the most it drafts, beside any of its settings
            ks = [f"k{k}"] if k else []
        return " ".join([self.method, *ks, *([self.k_policy] if self.k_policy != "fixed" else []),
                         *([self.drafter] if self.drafter not in ("model", NONE) else []), kind])


def declare_drafter(name: str, runs_model: bool, looks_up: bool) -> None:
    """A drafter option's class says whether it runs the pair's draft model and whether it looks up n-grams."""
    DRAFTER_PARTS[name] = (bool(runs_model), bool(looks_up))


def drafter_runs_model(drafter: str) -> bool:
    """Whether a drafter (an option's name or a ``tree:`` spec) runs the pair's draft model (an option no job
    declared: no)."""
    if is_tree(drafter):
        return FAMILIES[parse_tree(drafter).family].uses_model
    return DRAFTER_PARTS.get(drafter, (False, False))[0]


def drafter_looks_up(drafter: str) -> bool:
    """Whether a drafter looks up n-grams of the text every iteration (an option no job declared: no)."""
    if is_tree(drafter):
        return parse_tree(drafter).family == "lookup"
    return DRAFTER_PARTS.get(drafter, (False, False))[1]


PLAIN = Arm("plain")
PLAIN_CHOICE = "plain decoding"  # a reader's name of the plan's choice not to speculate
RECOMMENDED = Arm("recommended", None, PLAN, PLAN)  # the plan's choice for the prompt's kind


@dataclass
class ArmEntry:
    """One entry of ``stage.arms``: the arms of one method and drafter, for every stage and every engine (the config's
    list is built into these by Hydra's ``instantiate``, pipeline/jobs/arms.py).

    - ``method``: speculative (the engine's speculation), recommended (the plan's choice per kind), best_fixed (the
      campaign's exploratory check's best fixed configuration), published (the published answer's best configuration
      of each kind of the pair: the recheck, folded into the main job), or a transformers peer: hf_assisted (our k, no
      threshold), hf_default (the library's settings), hf_lookup (its prompt lookup).
    - ``drafter``: a drafter of the engine (speclab: a drafter option, model, prompt_lookup, hybrid; llama.cpp: its
      speculative type, model or ngram-*); null: the job's ``drafter`` (llama.cpp: its draft model).
    - ``k_policy``: fixed, cost_model or heuristic (speclab); null: the job's ``k_policy``.
    - ``ks``: one arm per k; null: the stage's ks (the top-level k when empty) for a fixed k or the job's own
      policy, the top-level k where another adaptive policy starts.
    - ``tree``: a tree shape, as data (``{family: static, branching: [3, 2, 1, 1]}``) or a short spec
      (``static:3-2-1-1``, ``dynamic:5-4-16``, ``lookup:4-6``): one arm, k its depth (speclab).
    - ``settings``: the engine's other settings of the drafter (llama.cpp: ``{p_min: 0.8}``), checked by the engine.
    - ``default``: the engine's own defaults for the drafter (no k of ours).
    """

    method: str = "speculative"
    drafter: Optional[str] = None
    k_policy: Optional[str] = None
    ks: Optional[list[int]] = None
    tree: Any = None
    settings: Optional[dict[str, Any]] = None
    default: bool = False

    def __post_init__(self) -> None:
        if self.method not in ENTRY_METHODS:
            raise ValueError(f"stage.arms method={self.method!r} is not allowed: use one of {list(ENTRY_METHODS)}")
        if self.ks is not None and (not list(self.ks) or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                                              for k in self.ks)):
            raise ValueError(f"stage.arms ks={list(self.ks)!r} is not allowed: use null or a non-empty list of "
                             "integers >= 1, e.g. [2,4]")
        if self.tree is not None:
            parse_tree(self.tree)
        if self.settings is not None and not isinstance(self.settings, Mapping):
            raise ValueError(f"stage.arms settings={self.settings!r} is not allowed: use a mapping such as {{p_min: 0.8}}")
        if not isinstance(self.default, bool):
            raise ValueError(f"stage.arms default={self.default!r} is not allowed: use true or false")

    def given(self) -> dict[str, Any]:
        """The keys this entry sets (the rest at their defaults), as a user writes it."""
        return given_keys(vars(self))


ENTRY_METHODS = ("speculative", "recommended", "best_fixed", "published", *PEER_METHODS.values())
OWN = ArmEntry()  # the job's drafter and k policy at stage.ks: a speed job's default arms


@dataclass(frozen=True)
class Job:
    """What an entry's nulls stand for: the job's drafter, k policy, stage ks and top-level k."""

    drafter: str
    k_policy: str
    ks: tuple[int, ...]
    k: int


def given_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of an entry's data that are set: not at ``ArmEntry``'s default (an absent key is at it), nor Hydra's
    ``_target_``."""
    fields = ArmEntry.__dataclass_fields__
    return {k: v for k, v in data.items() if k != "_target_" and not (k in fields and v == fields[k].default)}


def check_keys(data: Mapping[str, Any]) -> None:
    """A one-line ValueError for keys an entry does not have."""
    unknown = set(data) - set(ArmEntry.__dataclass_fields__) - {"_target_"}
    if unknown:
        raise ValueError(f"stage.arms entry {dict(data)} has unknown keys {sorted(unknown)}: use "
                         f"{list(ArmEntry.__dataclass_fields__)}")


def entry(data: Mapping[str, Any] | ArmEntry) -> ArmEntry:
    """An entry from plain data (a stored record's); a one-line ValueError for a bad one. A job's config builds its
    entries with Hydra's ``instantiate`` (pipeline/jobs/arms.py), which calls the same constructor."""
    if isinstance(data, ArmEntry):
        return data
    check_keys(data)
    return ArmEntry(**{k: v for k, v in data.items() if k != "_target_"})


def expand(e: ArmEntry, job: Job, best: tuple[str, int] | None = None,
           published: Iterable[Mapping[str, Any]] = ()) -> list[Arm]:
    """The arms of one entry. ``best`` is the campaign's best fixed (drafter, k), for a best_fixed entry;
    ``published`` the entries of the published configurations, for a published entry."""
    if e.method == "published":
        return [a for p in published for a in expand(entry(p), job)]
    if e.method == "recommended":
        return [RECOMMENDED]
    if e.method == "best_fixed":
        if best is None:
            raise ValueError("a best_fixed arm needs the campaign's best fixed configuration")
        return [Arm("speculative", best[1], "fixed", best[0])]
    if e.tree is not None:
        spec = parse_tree(e.tree)
        return [Arm("speculative", spec.depth, "fixed", spec.drafter)]
    ks = [int(k) for k in e.ks] if e.ks is not None else None
    if e.method in PEER_METHODS.values():
        mode = METHODS[e.method].peer_mode
        if mode == "default":  # the library's default schedule picks its own number of proposals
            return [Arm(e.method, None, LIBRARY_DEFAULT, "model")]
        return [Arm(e.method, k, "fixed", "prompt_lookup" if mode == "lookup" else "model") for k in ks or job.ks]
    drafter = e.drafter or job.drafter
    policy = e.k_policy or job.k_policy
    if ks is None:
        ks = list(job.ks) if policy in ("fixed", job.k_policy) else [job.k]
    return [Arm("speculative", k, policy, drafter) for k in ks]


def expand_all(entries: Iterable[Mapping[str, Any] | ArmEntry], job: Job,
               best: tuple[str, int] | None = None, published: Iterable[Mapping[str, Any]] = ()) -> list[Arm]:
    """Plain, then every entry's arms in order (an arm listed twice runs once)."""
    published = list(published)
    return list(dict.fromkeys([PLAIN, *(a for e in entries for a in expand(entry(e), job, best, published))]))


def needs(entries: Iterable[Mapping[str, Any] | ArmEntry], method: str) -> bool:
    """Whether any entry is of this method (a recommended arm needs a plan, best_fixed an exploratory check)."""
    return any(entry(e).method == method for e in entries)


def policies(entries: Iterable[Mapping[str, Any] | ArmEntry]) -> list[str]:
    """The k policies the entries name (a policy that reads a price table needs one measured first)."""
    return list(dict.fromkeys(e.k_policy for e in map(entry, entries) if e.k_policy))
