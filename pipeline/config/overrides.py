"""A value written as a Hydra override (``stage.arms=[{tree:'lookup:4-6'},{drafter:'model',ks:[2,4]}]``), for the
commands the pipeline writes for a user or runs for one: every string quoted (a tree spec holds ':'), an arm entry's
unset keys left out (null: the job's own)."""
from __future__ import annotations

from typing import Any


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items() if v is not None) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
