"""Bad input said in one line: ``key=value is not allowed: use ...``, whether Hydra or speclab found it."""
from __future__ import annotations

import re
from dataclasses import fields

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from pipeline.config.schema import (
    CHECKS, CONF_DIR, DRAFTERS, K_POLICIES, STAGE_SCHEMAS, ConfigError, check_config, close_matches, unknown_key_line,
)
from pipeline.tracking.redact import redact
from store.extend import override_key

# An engine's faults (a server that cannot start or dies, a build that cannot be done here) are said in one line by
# the engine itself (what failed and the server's last log line): its exception class declares ``one_line = True``.
ONE_LINE = "one_line"

# What a type error means to a user, by the type OmegaConf failed to convert to.
TYPE_WORDS = {"Integer": "an integer", "Boolean": "true or false", "Float": "a number", "String": "a string"}
CFG_FLAGS = {"--cfg", "-c", "--package", "-p"}
FLAG_PREFIXES = ("-",)
MULTIRUN_FLAGS = {"-m", "--multirun"}
# What Hydra's override grammar takes in a value without quotes (besides ',' between a sweep's values).
UNQUOTED = "ASCII letters, digits, spaces and $ % * + - . / : ? @ \\ _ |"
# The groups whose options have keys of their own (stage.ks is a key of stage=speed, not of stage=timing).
OPTION_SCHEMAS = {"stage": STAGE_SCHEMAS, "drafter": DRAFTERS, "k_policy": K_POLICIES}
NOT_SETTINGS = ("name", "parts", "_target_")


class JobEnded(ValueError):
    """A job of a multirun that was cancelled, refused its input or lost its worker: one line, as its failure in
    the sweep."""


class Interrupted(KeyboardInterrupt):
    """A polite kill (SIGTERM from a scheduler, ``kill``) taken like Ctrl-C, with the signal it came by."""

    def __init__(self, signum: int, why: str = "") -> None:
        super().__init__(f"signal {signum}" + (f": {why}" if why else ""))
        self.signum = signum


def interrupted_line(err: KeyboardInterrupt) -> tuple[str, int]:
    """The one line an interrupted command ends with, and its exit status (128 + the signal, as a shell's)."""
    import signal

    signum = getattr(err, "signum", signal.SIGINT)
    what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return (f"speclab: {what}: runs still open in MLflow are marked KILLED and finished result files are kept; "
            "rerun the same command to do the rest"), 128 + int(signum)


def quiet_interrupts() -> None:
    """Ctrl-C in a terminal reaches the process wherever it is: in a finalizer or a thread Python would print
    "Exception ignored" with a full traceback and go on. The entry point's one line says it instead."""
    import sys
    import threading

    unraisable, in_thread = sys.unraisablehook, threading.excepthook

    def quiet_unraisable(u) -> None:
        if not isinstance(u.exc_value, KeyboardInterrupt):
            unraisable(u)

    def quiet_thread(args) -> None:
        if not issubclass(args.exc_type, KeyboardInterrupt):
            in_thread(args)

    sys.unraisablehook, threading.excepthook = quiet_unraisable, quiet_thread


def _collapse(text: str) -> str:
    return " ".join(str(text).split())


def _override_value(err: BaseException, key: str) -> str | None:
    m = re.search(r"(?:override|use)\s+\+*" + re.escape(key.split("[")[0]) + r"=(.*)$", str(err), flags=re.M)
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
        return _other_option_line(key, getattr(cause, "object_type", None)) or \
            unknown_key_line(key, _override_value(err, key))
    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", str(err))
        options = re.findall(r"^\t(\S+)$", str(err), flags=re.M)
        if found and "/" in found.group(1):
            group, name = found.group(1).rsplit("/", 1)
            close = close_matches(name, options)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            return f"{group}={name} is not allowed: {hint}use one of {options} (or a YAML file in conf/{group}/)"
    if isinstance(err, OverrideParseException):
        return _grammar_line(err)
    return _collapse(err)


def _other_option_line(key: str, schema: type | None) -> str | None:
    """A key the chosen option of a group does not have but other options do (``stage.ks`` on the timing
    stage): which options read it and what the chosen one reads instead; None for any other key."""
    group, _, name = key.partition(".")
    options = OPTION_SCHEMAS.get(group)
    if options is None or schema not in options.values():
        return None
    readers = [option for option, typ in options.items() if name in {f.name for f in fields(typ)}]
    if not readers:
        return None
    mine = next(option for option, typ in options.items() if typ is schema)
    own = [f"{group}.{f.name}" for f in fields(schema) if f.name not in NOT_SETTINGS]
    close = close_matches(name, own)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    reads = f"reads {', '.join(own)}" if own else "has no settings of its own"
    return (f"{key} is not read by the {mine} {group} (it is a key of {group}={', '.join(readers)}): {hint}the {mine} "
            f"{group} {reads}; leave {key} out, or choose a {group} that reads it")


def _grammar_line(err: OverrideParseException) -> str:
    """An override Hydra cannot parse: the character it stopped at and what a value may hold."""
    override, lines = str(err.override), str(err.message).splitlines()
    at = ""
    if len(lines) > 1 and "^" in lines[1] and override in lines[0]:
        col = lines[1].index("^") - lines[0].index(override)
        if 0 <= col < len(override):
            at = f" at {override[col]!r} (character {col + 1})"
    elif found := re.search(r"input '(.+?)'", lines[0] if lines else ""):  # the parser's errors name the input
        at = f" at {found.group(1)!r}"
    key = override_key(override)
    allowed = f"; {key} takes {CHECKS[key][1]}" if key in CHECKS else ""
    return (f"{override!r} cannot be read{at}: a value without quotes may hold {UNQUOTED}; put any other text "
            f"in quotes ({key}='...'){allowed}")


def os_error_text(err: OSError) -> str:
    """``path: what went wrong`` (both paths of a rename or link); without a path, only what went wrong."""
    what = err.strerror or str(err) or type(err).__name__
    names = " -> ".join(str(name) for name in (err.filename, err.filename2) if name not in (None, ""))
    return f"{names}: {what}" if names else what


def error_line(err: BaseException) -> str | None:
    """The one-line message for bad input (credentials in URIs masked); None for an unexpected error (a bug
    keeps its traceback)."""
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return redact(_hydra_line(err))
    if isinstance(err, (ValueError, FileNotFoundError)) or getattr(type(err), ONE_LINE, False):
        return redact(_collapse(err))
    if isinstance(err, OSError):
        return redact(_collapse(os_error_text(err)))
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


def check_flag_order(argv: list[str]) -> None:
    """``-m`` between overrides makes argparse print its usage: say where it goes in one line."""
    for i, arg in enumerate(argv):
        before, after = argv[:i], argv[i + 1:]
        if arg in MULTIRUN_FLAGS and any(not a.startswith(FLAG_PREFIXES) for a in before) \
                and any(not a.startswith(FLAG_PREFIXES) for a in after):
            raise ValueError(f"{arg} must come before the overrides or after all of them: "
                             f"python -m pipeline.run {arg} {' '.join(a for a in argv if a != arg)}")


def precheck(argv: list[str]) -> None:
    """Flags out of place; and ``--cfg job`` prints a config without running it: check the config here so a bad
    value still says so."""
    check_flag_order(argv)
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


__all__ = ["ConfigError", "Interrupted", "JobEnded", "error_line", "interrupted_line", "precheck"]
