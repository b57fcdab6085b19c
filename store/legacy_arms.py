"""The speed stage's arms before they were a list: flags, and the translation both ways.

Until ``stage.arms``, a speed job's compared configurations came from eight flags (below, with their defaults).
Stored results are named by a hash of those flags, so a job's identity still is: an arm list that the flags can
express hashes as those flags (``identity_stage``). The flags stay config keys, unset by default, so that a
recorded command (``+sweep=check_plan stage.peer=false``) reruns as the same job: set, they apply to the
composed arm list (``effective_arms``). Pure data: no torch, no Hydra.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from speclab.specs.arms import PEER_METHODS, ArmEntry
from speclab.specs.tree_shapes import parse_tree

FLAGS: dict[str, Any] = {"peer": False, "peer_modes": ["matched"], "k_policies": [], "drafters": [],
                         "drafter_ks": [], "recommended": False, "best_fixed": False, "trees": []}
# A stored job's hash leaves a flag out at its default, but for ``peer`` (every speed job hashed it) and the three the
# acceptance stage still reads as keys of its own (drafters, k_policies, trees: their schema says when).
NEUTRAL_FLAGS: dict[str, Any] = {k: v for k, v in FLAGS.items() if k in ("peer_modes", "drafter_ks", "recommended",
                                                                          "best_fixed")}
PEER_MODES = {method: mode for mode, method in PEER_METHODS.items()}
# The top-level key a recorded command's flags ride in beside the arms they ran (pipeline/config/legacy_flags.py): its
# hash is named by them (``config_hash`` reads them into the stage), though they are no keys of the live schema.
RECORDED = "recorded_flags"
ENTRY_KEYS = tuple(f.name for f in fields(ArmEntry))  # method first


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
    """Entries with every key (absent ones null), lists as lists, tree shapes as their short specs."""
    return [{k: _value(e, k) for k in ENTRY_KEYS} for e in arms]


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


def set_flags(stage: Mapping[str, Any]) -> dict[str, Any]:
    """The flags a stage sets (unset ones are null)."""
    return {k: stage[k] for k in FLAGS if stage.get(k) is not None}


def merged_flags(stage: Mapping[str, Any], drafter: str, policy: str) -> dict[str, Any] | None:
    """The flags of the stage's arm list with the flags it sets on top, or None where no flags express the list
    (and it sets none)."""
    given, base = set_flags(stage), flags_from_arms(stage["arms"], drafter, policy)
    if given and base is None:
        raise ValueError(f"stage.arms={list(stage['arms'])} cannot take the flags {given}: write the arm list alone")
    return {**base, **given} if base is not None else None


def effective_arms(stage: Mapping[str, Any], drafter: str, policy: str) -> list[dict[str, Any]]:
    """The arm entries a job runs: its list, or what the flags it sets make of it."""
    if not set_flags(stage):
        return normalized(stage["arms"])
    return arms_from_flags(merged_flags(stage, drafter, policy), drafter, policy)


def identity_stage(stage: Mapping[str, Any], drafter: str, policy: str) -> dict[str, Any]:
    """The stage as a job's hash sees it: its arms as the flags that express them, where flags can."""
    if "arms" not in stage:
        return dict(stage)
    out = {k: v for k, v in stage.items() if k != "arms" and k not in FLAGS}
    flags = merged_flags(stage, drafter, policy)
    return {**out, **flags} if flags is not None else {**out, "arms": normalized(stage["arms"])}
