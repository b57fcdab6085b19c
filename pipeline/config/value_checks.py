"""Range and choice checks of config values: each a test and the words after ``use`` in its one-line error.

A check is attached to its key where the key is declared (``pipeline.config.settings.setting(check=...)``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from omegaconf import ListConfig

Check = tuple[Callable[[Any], bool], str]
MAX_THREADS = 4 * (os.cpu_count() or 1)  # more threads only cost memory (threads=100000 ran out of it)


def worded(check: Check, allowed: str) -> Check:
    """``check``'s test with other words for what is allowed (a hint of what the values mean)."""
    return check[0], allowed


def unset_or(check: Check) -> Check:
    """``check``, or null (a key a stage leaves unset)."""
    return (lambda v: v is None or check[0](v)), check[1]


def int_at_least(n: int) -> Check:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= n), f"an integer >= {n}"


def int_in(lo: int, hi: int, what: str = "") -> Check:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi), \
        what or f"an integer >= {lo} and <= {hi}"


def ints_at_least(n: int, nonempty: bool = False, below: int | None = None) -> Check:
    what = (f"a {'non-empty ' if nonempty else ''}list of integers >= {n}" + (f" and < {below}" if below else "")
            + ", e.g. [1,2,4]")
    return (lambda v: isinstance(v, (list, ListConfig)) and (len(v) > 0 or not nonempty)
            and all(isinstance(x, int) and not isinstance(x, bool) and n <= x < (below or x + 1) for x in v)), what


def number_in(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Check:
    def ok(v: Any) -> bool:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    return ok, f"a number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def one_of(*choices: str) -> Check:
    return (lambda v: v in choices), f"one of {list(choices)}"


def subset_of(*choices: str) -> Check:
    return (lambda v: isinstance(v, (list, ListConfig)) and all(x in choices for x in v)), \
        f"a list drawn from {list(choices)}"


def positive_or_null() -> Check:
    return (lambda v: v is None or (isinstance(v, (int, float)) and v > 0)), "null (measure it) or a number > 0"


def nonblank(allowed: str) -> Check:
    return (lambda v: bool(str(v).strip())), allowed


def matches(pattern: Any, allowed: str) -> Check:
    """A value whose text ``pattern`` (a compiled regex) matches."""
    return (lambda v: bool(pattern.match(str(v)))), allowed
