"""Config identity: a hash of what a job measures names its output file.

The config comes in as plain nested data (the pipeline resolves its Hydra config first). Keys that say
where or how a job ran (``volatile``), keys added later at their old value (``neutral``) and keys that name code
rather than a measurement (Hydra's ``_target_``) stay out of the hash: the pipeline walks ``volatile`` and
``neutral`` out of its schema, where each key declares its own (the store keeps no list of them); what the job
reads besides its config (``inputs``: the plan it follows, the best fixed configuration) goes in.
Same concept, other floor: ``pipeline/jobs/identity.py``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from store.legacy_arms import RECORDED, identity_tree

CODE_KEY = "_target_"  # names the class that runs a setting (Hydra instantiate), not what it measures


@dataclass(frozen=True)
class Neutral:
    """A key's value that reproduces results stored before the key existed: at it the key stays out of the
    hash, so those results keep their identity. ``only_for``: the stage names it does so for (None: all)."""

    value: Any
    only_for: tuple[str, ...] | None = None

    def leaves_out(self, value: Any, stage: str) -> bool:
        return value == self.value and (self.only_for is None or stage in self.only_for)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested plain data as dotted keys (``stage.ks``, ``drift.max_ratio``), leaves unchanged."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def measured(flat: Mapping[str, Any], volatile: tuple[str, ...]) -> dict[str, Any]:
    """The dotted keys that say what a job measures (its MLflow params): all but code keys and those that start
    with a ``volatile`` key (``mlflow.``: every key under it)."""
    return {k: v for k, v in flat.items() if not k.startswith(tuple(volatile)) and k.rsplit(".", 1)[-1] != CODE_KEY}


def config_hash(config: Mapping[str, Any], inputs: Mapping[str, Any] | None = None, *,
                neutral: Mapping[str, Neutral], volatile: tuple[str, ...],
                engine_arms: Sequence[Mapping[str, Any]] = (),
                stage_preset: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The 16-hex-digit identity of a job: ``config`` is its resolved config as plain data, ``inputs`` what
    it reads besides (None: ``config`` already holds them under ``inputs``, frozen by the job), ``neutral``
    the dotted keys left out at their neutral value (``pipeline.config.schema.HASH_NEUTRAL``), ``volatile``
    the keys that say where or how a job ran (``pipeline.config.schema.VOLATILE``), ``engine_arms`` the engine's
    default arms and ``stage_preset`` the arms its stage file sets (store/legacy_arms.py ``identity_tree``: how an
    engine's arms hashed before ``stage.arms``)."""
    tree = dict(config) if inputs is None else {**config, "inputs": inputs}
    recorded = tree.pop(RECORDED, None) or {}  # a recorded command's flags from before stage.arms: stage keys then
    stage = str(config["stage"]["name"])
    # A job's arm list hashes as the keys that came before it, where they express it (store/legacy_arms.py).
    tree = identity_tree({**tree, "stage": {**config["stage"], **recorded}}, engine_arms, stage_preset)
    flat = {k: v for k, v in measured(flatten(tree), volatile).items()
            if not (k in neutral and neutral[k].leaves_out(v, stage))}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]
