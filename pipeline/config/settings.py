"""A config key's one home: its schema field carries its default, its check, its hash-neutral value and its doc.

``setting`` declares a key; ``same_as`` restates a key another schema of the same group declared (the stage
schemas share one namespace: ``stage.timing_repeats`` of the speed and the batch stage is one key, with one check
and one neutral value, whatever the default; stages that run alike share a key by inheriting its field instead,
as ``stage.rounds``). The tables the rest of the pipeline reads (the checks run before any
model loads, the keys left out of a job's hash, the keys one engine reads) are walked out of the schemas here,
never written by hand.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, field, fields, is_dataclass
from typing import Any

from pipeline.config.value_checks import Check
from store.identity import Neutral


class _Unset:
    def __repr__(self) -> str:
        return "NOT_NEUTRAL"


NOT_NEUTRAL: Any = _Unset()  # a key that is always part of a job's identity (None is a neutral value, too)
_OWN_DEFAULT: Any = object()
_PLAIN = {"check": None, "neutral": NOT_NEUTRAL, "neutral_for": None, "arm_hashed": False, "volatile": False,
          "engine": None, "doc": ""}


def setting(default: Any, check: Check | None = None, *, neutral: Any = NOT_NEUTRAL,
            neutral_for: Iterable[str] | None = None, arm_hashed: bool = False, volatile: bool = False,
            engine: str | None = None, doc: str = "") -> Any:
    """A schema field declaring one config key.

    ``check``: the allowed range or choices (``pipeline.config.value_checks``), tested before any model loads.
    ``neutral``: the value that reproduces results stored before the key existed; at it the key stays out of
    a job's config hash, so those results keep their identity (a key added later must have one).
    ``neutral_for``: the stage names (``stage.name``) it is neutral for, where other stages hashed the key before.
    ``arm_hashed``: a cost-model key that names a job whose arm takes the schema's defaults, when off ``neutral``
    (``pipeline.jobs.inputs``). ``volatile``: the key says where or how a job ran, not what it measures: it
    stays out of every job's hash and MLflow params (``store.identity.measured``). ``engine``: the one engine
    that reads the key (``pipeline.engines.option_checks`` refuses it set under another); None: every engine.
    ``doc``: what the key means, for a reader of the schema and of ``--cfg job``.
    """
    meta = {"check": check, "neutral": neutral, "neutral_for": tuple(neutral_for) if neutral_for else None,
            "arm_hashed": arm_hashed, "volatile": volatile, "engine": engine, "doc": doc}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(schema: type, *, volatile: bool = False) -> Any:
    """A field holding a nested schema (``mlflow``, ``trust``); ``volatile``: all of its keys (as ``setting``)."""
    return field(default_factory=schema, metadata={"volatile": volatile})


def same_as(owner: type, name: str, default: Any = _OWN_DEFAULT) -> Any:
    """The key ``name`` as ``owner`` declares it (check, neutral value, doc), with its default or another."""
    declared: Field = owner.__dataclass_fields__[name]
    if default is _OWN_DEFAULT:
        default = declared.default_factory() if declared.default_factory is not NO_DEFAULT else declared.default
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=declared.metadata)
    return field(default=default, metadata=declared.metadata)


def _meta(f: Field) -> dict[str, Any]:
    return {**_PLAIN, **f.metadata}


def declarations(groups: Mapping[str, Iterable[type]]) -> dict[str, dict[str, Any]]:
    """Each dotted key's declaration (check, neutral, neutral_for, arm_hashed, volatile, engine, doc), over the
    schemas of each prefix (``stage.``: every stage schema). A key two schemas declare differently is refused
    here, at import."""
    out: dict[str, dict[str, Any]] = {}
    for prefix, schemas in groups.items():
        for schema in schemas:
            for f in fields(schema):
                key, meta = prefix + f.name, _meta(f)
                if key in out and out[key] != meta:
                    raise TypeError(f"{key} of {schema.__name__} is declared unlike another schema's: declare it once "
                                    f"with setting() and restate it with same_as()")
                out.setdefault(key, meta)
    return out


def checks(groups: Mapping[str, Iterable[type]], first: Mapping[str, Check] | None = None) -> dict[str, Check]:
    """The checks of every key, prefix by prefix; ``first``: checks of a group's option name, before its keys."""
    first = first or {}
    out: dict[str, Check] = {}
    for prefix, schemas in groups.items():
        out.update({k: c for k, c in first.items() if k.startswith(prefix) and "." not in k[len(prefix):]})
        out.update({k: m["check"] for k, m in declarations({prefix: schemas}).items() if m["check"] is not None})
    return out


def neutral_table(groups: Mapping[str, Iterable[type]]) -> dict[str, Neutral]:
    """The keys that stay out of a job's hash at their neutral value (``store.identity.config_hash``)."""
    return {k: Neutral(m["neutral"], m["neutral_for"]) for k, m in declarations(groups).items()
            if m["neutral"] is not NOT_NEUTRAL}


def volatile_keys(groups: Mapping[str, Iterable[type]]) -> tuple[str, ...]:
    """The keys declared volatile, dotted; a nested schema's as its prefix (``mlflow.``: every key under it), the
    way ``store.identity.measured`` matches them (by the start of a dotted key)."""
    out: list[str] = []
    for prefix, schemas in groups.items():
        for schema in schemas:
            for f in fields(schema):
                if _meta(f)["volatile"]:
                    nested = f.default_factory is not NO_DEFAULT and is_dataclass(f.default_factory)
                    key = f"{prefix}{f.name}{'.' if nested else ''}"
                    out += [key] if key not in out else []
    return tuple(out)


def engine_keys(schemas: Iterable[type], engine: str) -> tuple[str, ...]:
    """The keys of ``schemas`` (undotted, in declaration order) that only ``engine`` reads."""
    return tuple(dict.fromkeys(f.name for s in schemas for f in fields(s) if _meta(f)["engine"] == engine))


def arm_hashed(schema: type) -> dict[str, Any]:
    """``schema``'s keys that name a job whose arm takes its defaults, each with its neutral value."""
    return {f.name: _meta(f)["neutral"] for f in fields(schema) if _meta(f)["arm_hashed"]}

