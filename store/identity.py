"""Config identity: a hash of what a job measures names its output file.

The config comes in as plain nested data (the pipeline resolves its Hydra config first). Keys that say
where or how a job ran (``VOLATILE``), keys added later at their old value (``store.compat``) and keys
that name code rather than a measurement (Hydra's ``_target_``) stay out of the hash; what the job reads
besides its config (``inputs``: the plan it follows, the best fixed configuration) goes in.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from store.compat import hash_neutral

# Keys that do not change what a job measures (nor its MLflow params). The campaign says where a result
# is filed, not what it measures: one measurement keeps one hash across campaigns.
VOLATILE = ("force", "overwrite_published", "mlflow.", "outputs_dir", "threads", "campaign")
CODE_KEY = "_target_"  # names the class that runs a setting (Hydra instantiate), not what it measures


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


def measured(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The dotted keys that say what a job measures (its MLflow params): all but ``VOLATILE`` and code keys."""
    return {k: v for k, v in flat.items() if not k.startswith(VOLATILE) and k.rsplit(".", 1)[-1] != CODE_KEY}


def config_hash(config: Mapping[str, Any], inputs: Mapping[str, Any] | None = None) -> str:
    """The 16-hex-digit identity of a job: ``config`` is its resolved config as plain data, ``inputs`` what
    it reads besides (None: ``config`` already holds them under ``inputs``, frozen by the job)."""
    tree = dict(config) if inputs is None else {**config, "inputs": inputs}
    stage = str(config["stage"]["name"])
    flat = {k: v for k, v in measured(flatten(tree)).items() if not hash_neutral(k, v, stage)}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]
