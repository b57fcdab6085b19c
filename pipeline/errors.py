"""Bad input said in one line: ``key=value is not allowed: use ...``, whether Hydra or speclab found it."""
from __future__ import annotations

import re

from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from pipeline.config_schema import CHECKS, CONF_DIR, ConfigError, check_config

# What a type error means to a user, by the type OmegaConf failed to convert to.
TYPE_WORDS = {"Integer": "an integer", "Boolean": "true or false", "Float": "a number", "String": "a string"}
CFG_FLAGS = {"--cfg", "-c", "--package", "-p"}
FLAG_PREFIXES = ("-",)


def _collapse(text: str) -> str:
    return " ".join(str(text).split())


def _override_value(err: BaseException, key: str) -> str | None:
    m = re.search(r"override\s+\+*" + re.escape(key.split("[")[0]) + r"=(.*)$", str(err).splitlines()[0])
    return m.group(1) if m else None


def _hydra_line(err: BaseException) -> str:
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ValidationError) and key:
        base = key.split("[")[0]
        value = _override_value(err, base)
        typ = re.search(r"converted to (\w+)|not a valid (bool)", str(cause))
        word = (typ.group(1) or "Boolean") if typ else ""
        allowed = CHECKS[base][1] if base in CHECKS else TYPE_WORDS[word] if word in TYPE_WORDS else "another value"
        shown = repr(value) if value is not None else f"(value {_collapse(cause.msg)})"
        return f"{base}={shown} is not allowed: use {allowed}"
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key:
        return (f"{key} is not a config key here: check its spelling (`python -m pipeline.run --cfg job` "
                f"lists the keys) or add a new key with +{key}=VALUE")
    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", str(err))
        options = re.findall(r"^\t(\S+)$", str(err), flags=re.M)
        if found and "/" in found.group(1):
            group, name = found.group(1).rsplit("/", 1)
            return f"{group}={name} is not allowed: use one of {options} (or a YAML file in conf/{group}/)"
    return _collapse(err)


def error_line(err: BaseException) -> str | None:
    """The one-line message for bad input; None for an unexpected error (a bug keeps its traceback)."""
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return _hydra_line(err)
    if isinstance(err, (ValueError, FileNotFoundError)):
        return _collapse(err)
    if isinstance(err, OSError):
        return _collapse(f"{err.filename or ''}: {err.strerror or err}")
    return None


def _overrides(argv: list[str]) -> list[str] | None:
    """The config overrides of a ``--cfg`` call (None when there is none)."""
    if not CFG_FLAGS & set(argv):
        return None
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in CFG_FLAGS:
            skip = True
        elif not arg.startswith(FLAG_PREFIXES):
            out.append(arg)
    return out


def precheck(argv: list[str]) -> None:
    """``--cfg job`` prints a config without running it: check the ranges here so a bad value still says so."""
    overrides = _overrides(argv)
    if overrides is None:
        return
    from hydra import compose, initialize_config_dir

    from store.layout import STAGES

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except HydraException as err:
            if "Ambiguous value" in str(err) or "sweep" in str(err).lower():
                return  # a sweep's values are checked as each of its jobs starts
            raise
        check_config(cfg, STAGES)


__all__ = ["ConfigError", "error_line", "precheck"]
