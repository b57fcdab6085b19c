"""llama.cpp's speculative configurations as speclab arms, and back as the server flags a user pastes.

An arm run by llama.cpp keeps speclab's columns: ``drafter`` is llama.cpp's speculative type (``model`` for
its draft-model type ``draft-simple``; ``ngram-simple``, ``ngram-map-k``, ``ngram-mod``, ``ngram-cache``),
``k`` the most tokens it drafts (the type's own flag: ``--spec-draft-n-max`` for a draft model, the m-gram
length for the n-gram types; 0: llama.cpp's default) and ``k_policy`` its other settings as ``name=value``
pairs (``n_min=2,p_min=0.8``), ``fixed`` when there are none, ``library_default`` for llama.cpp's defaults.
Torch-free.
Same concept, other floors: ``pipeline/jobs/arms.py``, ``speclab/specs/arms.py``; other engines: ``engines/<name>/arms.py``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speclab.specs.arms import LIBRARY_DEFAULT, NONE, Arm

ENGINE = "llama_cpp"


@dataclass(frozen=True)
class SpecType:
    drafter: str                      # the arm's drafter column
    spec_type: str                    # --spec-type
    k_flag: str | None                # the flag k sets (None: the type has no length knob)
    settings: dict[str, tuple[str, type]] = field(default_factory=dict)  # name -> (flag, type)
    uses_model: bool = False          # needs --spec-draft-model


SPEC_TYPES = {t.drafter: t for t in (
    SpecType("model", "draft-simple", "--spec-draft-n-max",
             {"n_min": ("--spec-draft-n-min", int), "p_min": ("--spec-draft-p-min", float)}, uses_model=True),
    SpecType("ngram-simple", "ngram-simple", "--spec-ngram-simple-size-m",
             {"size_n": ("--spec-ngram-simple-size-n", int), "min_hits": ("--spec-ngram-simple-min-hits", int)}),
    SpecType("ngram-map-k", "ngram-map-k", "--spec-ngram-map-k-size-m",
             {"size_n": ("--spec-ngram-map-k-size-n", int), "min_hits": ("--spec-ngram-map-k-min-hits", int)}),
    SpecType("ngram-mod", "ngram-mod", "--spec-ngram-mod-n-max",
             {"n_min": ("--spec-ngram-mod-n-min", int), "n_match": ("--spec-ngram-mod-n-match", int)}),
    SpecType("ngram-cache", "ngram-cache", None),
)}
DRAFTERS = tuple(SPEC_TYPES)


def settings_label(settings: Mapping[str, Any] | None) -> str:
    """``n_min=2,p_min=0.8`` (sorted; numbers as written), or ``fixed`` when there are none."""
    if not settings:
        return "fixed"
    return ",".join(f"{k}={_number(v)}" for k, v in sorted(settings.items()))


def _number(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_settings(label: str) -> dict[str, float | int]:
    """The settings of a ``k_policy`` label (``fixed`` and ``library_default``: none)."""
    if label in ("fixed", LIBRARY_DEFAULT, NONE, ""):
        return {}
    out = {}
    for pair in label.split(","):
        name, _, value = pair.partition("=")
        out[name] = float(value) if any(c in value for c in ".eE") else int(value)
    return out


def check_settings(drafter: str, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of one arm, checked against its type; a one-line ValueError naming the bad one."""
    if drafter not in SPEC_TYPES:
        raise ValueError(f"drafter={drafter!r} is not a llama.cpp speculative type: use one of {list(DRAFTERS)}")
    known = SPEC_TYPES[drafter].settings
    out = {}
    for name, value in (settings or {}).items():
        if name not in known:
            raise ValueError(f"settings.{name} is not a setting of llama.cpp's {drafter}: use "
                             f"{sorted(known) or 'none (this type has no settings)'}")
        kind = known[name][1]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (kind is float or float(value).is_integer()) and value >= 0
              and (name != "p_min" or value <= 1))
        if not ok:
            allowed = "a number in [0, 1]" if name == "p_min" else "an integer >= 0"
            raise ValueError(f"settings.{name}={value!r} is not allowed for {drafter}: use {allowed}")
        out[name] = kind(value)
    return out


def arm(drafter: str, k: int | None, settings: Mapping[str, Any] | None = None, *, default: bool = False) -> Arm:
    """The arm of one llama.cpp configuration (``default``: llama.cpp's own settings for the type)."""
    checked = check_settings(drafter, settings)
    if default or SPEC_TYPES[drafter].k_flag is None:
        return Arm("speculative", None, LIBRARY_DEFAULT if not checked else settings_label(checked), drafter, ENGINE)
    return Arm("speculative", k, settings_label(checked), drafter, ENGINE)


def flags(a: Arm, draft_model: str | None = None) -> list[str]:
    """The llama-server options that run arm ``a`` (none for plain decoding)."""
    if a.drafter in (NONE, "") or a.method == "plain":
        return []
    t = SPEC_TYPES[a.drafter]
    out = ["--spec-type", t.spec_type]
    if t.uses_model:
        if not draft_model:
            raise ValueError(f"llama.cpp's {a.drafter} arm needs a draft GGUF file")
        out += ["--spec-draft-model", str(draft_model)]
    if a.k and t.k_flag:
        out += [t.k_flag, str(a.k)]
    for name, value in sorted(parse_settings(a.k_policy).items()):
        out += [t.settings[name][0], _number(value)]
    return out


def pasted_flags(a: Arm | None, draft_name: str = "DRAFT.gguf") -> str:
    """What a user adds to their llama-server command for this configuration; "no speculation" for plain."""
    if a is None or a.method == "plain" or a.drafter in (NONE, ""):
        return "no speculation (no --spec-* flags)"
    return " ".join(flags(a, draft_name))


def load_switch(a: Arm, up_to: int) -> str:
    """llama-server speculates per server, not per load: the slot count at which to drop the draft."""
    return (f"`llama-server --parallel N {pasted_flags(a)}` while N <= {up_to}; above {up_to} slots, no --spec-* "
            "flags")
