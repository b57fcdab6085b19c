"""The arms before they were one list, ``stage.arms``: the old dialects, and the translation both ways.

Stored results are named by a hash of the config their job ran, and three dialects came before ``stage.arms``:

- the speed stage's eight flags (``FLAGS``, with their defaults);
- the acceptance and plan stages' four keys (``ACCEPTANCE_KEYS``: drafters, k_policies, policy_drafters, trees);
- llama.cpp's own list, ``engine.arms`` (``{drafter, ks, settings, default}`` entries).

So a job's identity still is the old dialect wherever the old dialect expresses its arms (``identity_tree``): an arm
list the flags or keys can express hashes as them, a llama.cpp job's configurations as its ``engine.arms``. A recorded
command that sets an old key reruns as the arm list it ran (pipeline/config/legacy_flags.py), its keys riding beside
it (``RECORDED``). Pure data: no torch, no Hydra.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from speclab.specs.arms import PEER_METHODS, ArmEntry, given_keys
from speclab.specs.tree_shapes import parse_tree

FLAGS: dict[str, Any] = {"peer": False, "peer_modes": ["matched"], "k_policies": [], "drafters": [],
                         "drafter_ks": [], "recommended": False, "best_fixed": False, "trees": []}
ACCEPTANCE_KEYS: dict[str, Any] = {"drafters": [], "k_policies": [], "policy_drafters": [], "trees": []}
# A stored job's hash leaves an old key out at its neutral value (and, where given, only for these stages): the speed
# flags at their defaults but ``peer`` (every speed job hashed it); the acceptance keys at [] (``k_policies`` only for
# the acceptance stage: the speed stage and the plan hashed it).
NEUTRAL_KEYS: dict[str, tuple[Any, tuple[str, ...] | None]] = {
    **{k: (v, None) for k, v in FLAGS.items() if k in ("peer_modes", "drafter_ks", "recommended", "best_fixed")},
    **{k: ([], ("acceptance",) if k == "k_policies" else None) for k in ACCEPTANCE_KEYS}}
LLAMA_CPP = "llama_cpp"  # the engine whose configurations were ``engine.arms`` entries
LLAMA_KEYS = ("drafter", "ks", "settings", "default")  # an engine.arms entry's keys
PEER_MODES = {method: mode for mode, method in PEER_METHODS.items()}
# The top-level key a recorded command's flags ride in beside the arms they ran (pipeline/config/legacy_flags.py): its
# hash is named by them (``config_hash`` reads them into the stage), though they are no keys of the live schema.
RECORDED = "recorded_flags"
# An entry's keys (method first); the engine's own (settings, default) appear in a hashed list only where set.
ENTRY_KEYS = ("method", "drafter", "k_policy", "ks", "tree")
ENGINE_ENTRY_KEYS = tuple(f.name for f in fields(ArmEntry) if f.name not in ENTRY_KEYS)


def _entry(method: str = "speculative", **given: Any) -> dict[str, Any]:
    return {"method": method, **{k: given.get(k) for k in ENTRY_KEYS[1:]}}


def _value(e: Mapping[str, Any], key: str) -> Any:
    value = e.get(key, "speculative" if key == "method" else None)
    if key == "ks" and value is not None:
        return list(value)
    if key == "tree" and isinstance(value, Mapping):  # a shape as data names the job as its short spec does
        return parse_tree(value).label
    return value


def normalized(arms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Entries with every key (absent ones null), lists as lists, tree shapes as their short specs; an engine's own
    keys only where set."""
    return [{**{k: _value(e, k) for k in ENTRY_KEYS},
             **{k: v for k, v in given_keys(e).items() if k in ENGINE_ENTRY_KEYS}} for e in arms]


def arms_from_flags(flags: Mapping[str, Any], drafter: str, policy: str) -> list[dict[str, Any]]:
    """The arm entries the flags ran, in their order (the job's ``drafter`` and k ``policy`` fill the nulls)."""
    f = {**FLAGS, **flags}
    out = [_entry("best_fixed") if f["best_fixed"] else _entry()]
    out += [_entry(k_policy=str(p)) for p in f["k_policies"] if p != policy]
    ks = [int(k) for k in f["drafter_ks"]] or None
    out += [_entry(drafter=str(d), k_policy="fixed", ks=ks) for d in f["drafters"] if d != drafter]
    out += [_entry(tree=str(t)) for t in f["trees"]]
    out += [_entry("recommended")] if f["recommended"] else []
    out += [_entry(PEER_METHODS[str(m)]) for m in f["peer_modes"]] if f["peer"] else []
    return out


def flags_from_arms(arms: Sequence[Mapping[str, Any]], drafter: str, policy: str) -> dict[str, Any] | None:
    """The flags that run exactly these entries, or None where no flags do (then the list is the identity)."""
    entries = normalized(arms)
    f: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in FLAGS.items()}
    if not entries:
        return None
    first, rest = entries[0], entries[1:]
    f["best_fixed"] = first == _entry("best_fixed")
    modes = [PEER_MODES[e["method"]] for e in rest if e["method"] in PEER_MODES]
    if modes:
        f["peer"], f["peer_modes"] = True, modes
    for e in rest:
        if e["method"] == "recommended":
            f["recommended"] = True
        elif e["tree"] is not None:
            f["trees"].append(e["tree"])
        elif e["drafter"] is not None:
            f["drafters"].append(e["drafter"])
            f["drafter_ks"] = e["ks"] or []
        elif e["k_policy"] is not None:
            f["k_policies"].append(e["k_policy"])
    return f if arms_from_flags(f, drafter, policy) == entries else None


def arms_from_keys(keys: Mapping[str, Any], drafter: str, policy: str) -> list[dict[str, Any]]:
    """The arm entries the acceptance stage's keys ran: each drafter at the stage's ks (none: the job's), then each
    adaptive policy with each of policy_drafters (none: the job's), then the trees. (A policy that is the job's own
    ran only at the stage's ks, as its chains did: the entry adds no configuration, speclab.specs.arms.expand.)"""
    k = {**ACCEPTANCE_KEYS, **keys}
    out = [_entry(drafter=str(d)) for d in k["drafters"]] or [_entry()]
    out += [_entry(drafter=None if d is None else str(d), k_policy=str(p))
            for d in (k["policy_drafters"] or [None]) for p in k["k_policies"]]
    return out + [_entry(tree=_value({"tree": t}, "tree")) for t in k["trees"]]


def keys_from_arms(arms: Sequence[Mapping[str, Any]], drafter: str, policy: str) -> dict[str, Any] | None:
    """The acceptance keys that run exactly these entries, or None where none do (then the list is the identity)."""
    entries = normalized(arms)
    chains = [e for e in entries if e["k_policy"] is None and e["tree"] is None]
    policies = [e for e in entries if e["k_policy"] is not None]
    keys = {"drafters": [] if chains == [_entry()] else [e["drafter"] for e in chains],
            "k_policies": list(dict.fromkeys(e["k_policy"] for e in policies)),
            "policy_drafters": [d for d in dict.fromkeys(e["drafter"] for e in policies) if d is not None],
            "trees": [e["tree"] for e in entries if e["tree"] is not None]}
    return keys if arms_from_keys(keys, drafter, policy) == entries else None


@dataclass(frozen=True)
class Dialect:
    """One stage family's keys from before ``stage.arms`` and their translation both ways."""

    keys: Mapping[str, Any]
    to_arms: Callable[[Mapping[str, Any], str, str], list[dict[str, Any]]]
    from_arms: Callable[[Sequence[Mapping[str, Any]], str, str], dict[str, Any] | None]


SPEED = Dialect(FLAGS, arms_from_flags, flags_from_arms)
ACCEPTANCE = Dialect(ACCEPTANCE_KEYS, arms_from_keys, keys_from_arms)


def dialect(stage: Mapping[str, Any]) -> Dialect:
    """The old dialect of a stage's arms, by its schema: the speed flags for a stage of the speed stage's schema (it
    races: speed, quick, all), else the acceptance keys (acceptance, plan)."""
    return SPEED if "race" in stage else ACCEPTANCE


def set_flags(stage: Mapping[str, Any], d: Dialect = SPEED) -> dict[str, Any]:
    """The old keys a stage sets (unset ones are null)."""
    return {k: stage[k] for k in d.keys if stage.get(k) is not None}


def merged_flags(stage: Mapping[str, Any], drafter: str, policy: str) -> dict[str, Any] | None:
    """The old keys of the stage's arm list with those it sets on top, or None where no keys express the list
    (and it sets none)."""
    d = dialect(stage)
    given, base = set_flags(stage, d), d.from_arms(stage["arms"], drafter, policy)
    if given and base is None:
        raise ValueError(f"stage.arms={list(stage['arms'])} cannot take the flags {given}: write the arm list alone")
    return {**base, **given} if base is not None else None


def effective_arms(stage: Mapping[str, Any], drafter: str, policy: str) -> list[dict[str, Any]]:
    """The arm entries a job runs: its list, or what the old keys it sets make of it."""
    d = dialect(stage)
    if not set_flags(stage, d):
        return normalized(stage["arms"])
    return d.to_arms(merged_flags(stage, drafter, policy), drafter, policy)


def identity_stage(stage: Mapping[str, Any], drafter: str, policy: str) -> dict[str, Any]:
    """The stage as a job's hash sees it: its arms as the old keys that express them, where keys can."""
    if "arms" not in stage:
        return dict(stage)
    d = dialect(stage)
    out = {k: v for k, v in stage.items() if k != "arms" and k not in d.keys}
    keys = merged_flags(stage, drafter, policy)
    return {**out, **keys} if keys is not None else {**out, "arms": normalized(stage["arms"])}


def llama_entry(e: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as llama.cpp's ``engine.arms`` wrote it: only the keys set."""
    return {k: v for k, v in given_keys(e).items() if k in LLAMA_KEYS}


def hashed_arms(engine: str, arms: Sequence[Mapping[str, Any]],
                stage_preset: Sequence[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The stage's arm entries as a job's hash sees them: a llama.cpp job's stage kept what it had before its
    configurations were arms, its stage file's preset (``stage_preset``: stage=plan's speclab drafters, set though
    unread; none: the job's own drafter) and the plan's choice; another engine's, the arms it runs."""
    entries = normalized(arms)
    if engine != LLAMA_CPP:
        return entries
    return [*normalized(stage_preset or [{}]), *(e for e in entries if e["method"] != "speculative")]


def identity_tree(tree: Mapping[str, Any], engine_arms: Sequence[Mapping[str, Any]] = (),
                  stage_preset: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A job's plain config as its hash sees it. A llama.cpp job's configurations hash as its ``engine.arms``, as they
    did before ``stage.arms`` (a stage without arms: the engine's default arms, ``engine_arms``); its stage's arms as
    they were then: the stage file's preset (``stage_preset``: stage=plan's speclab drafters, set though unread) or the
    job's own, and the plan's choice. Then the stage's arms as its dialect's keys (``identity_stage``)."""
    out = dict(tree)
    stage = dict(out["stage"])
    names = {group: str((out.get(group) or {}).get("name", "")) for group in ("drafter", "k_policy")}
    if str((out.get("engine") or {}).get("name", "")) == LLAMA_CPP:
        entries = normalized(stage["arms"]) if stage.get("arms") is not None else normalized(engine_arms)
        out["engine"] = {**out["engine"], "arms": [llama_entry(e) for e in entries if e["method"] == "speculative"]}
        if "arms" in stage:
            stage["arms"] = hashed_arms(LLAMA_CPP, entries, stage_preset)
    out["stage"] = identity_stage(stage, names["drafter"], names["k_policy"])
    return out
