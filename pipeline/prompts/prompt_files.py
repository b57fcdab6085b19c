"""Workloads in Spec-Bench's JSONL schema: one JSON object a line with ``question_id``, ``category``,
``turns`` (one or two user turns) and an optional ``reference`` (kept by Spec-Bench for grading; not read).

Each bad line is a one-line ValueError naming the file, the line and what is allowed, like the YAML sets'.
Other fields of a line are not read (a user's export may carry its own metadata).
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.prompts.prompt import MAX_TURNS, Prompt, check_unicode

JSONL_SUFFIX = ".jsonl"  # compared without case: x.JSONL is JSONL too
MAX_NESTING = 200  # brackets deep: where a file too deep for the parsers (~500 YAML, ~1000 JSON) is said to go wrong
ALLOWED = (f"one JSON object a line with question_id (an integer or a string), category (a string) and turns "
           f"(a list of 1 to {MAX_TURNS} non-empty strings), reference optional")


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")  # a BOM from an editor is not part of the first line
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"prompt file {str(path)!r} cannot be read ({type(err).__name__}): write UTF-8 JSONL, "
                         f"{ALLOWED}") from None


def is_jsonl(path: Path) -> bool:
    """Whether ``path`` is read as Spec-Bench JSONL (by its suffix, in any case)."""
    return path.suffix.lower() == JSONL_SUFFIX


def too_deep(text: str) -> int | None:
    """The first line (from 1) where ``text``'s brackets nest deeper than ``MAX_NESTING``, else None (counted
    without regard to quotes: it only points at the line of a file whose parser overflowed its recursion)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return None
    depth = 0
    for n, line in enumerate(text.split("\n"), 1):
        for char in line:
            depth = depth + 1 if char in "[{" else max(0, depth - 1) if char in "]}" else depth
            if depth > MAX_NESTING:
                return n
    return None


def _item(entry: object, where: str) -> tuple[str, str, tuple[str, ...]]:
    """(question id, category, turns) of one parsed line, or a one-line ValueError."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} holds a JSON {type(entry).__name__}, not an object: write {ALLOWED}")
    missing = [f for f in ("question_id", "category", "turns") if entry.get(f) is None]
    if missing:
        raise ValueError(f"{where} lacks {missing}: write {ALLOWED}")
    qid, category, turns = entry["question_id"], entry["category"], entry["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or not str(qid).strip():
        raise ValueError(f"{where} has question_id {qid!r}: use an integer or a non-empty string")
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"{where} has category {category!r}: use a non-empty string (it becomes the prompt's kind)")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where} has turns {turns!r}: use a list of 1 to {MAX_TURNS} non-empty strings")
    if len(turns) > MAX_TURNS:
        raise ValueError(f"{where} has {len(turns)} turns: at most {MAX_TURNS} are allowed (Spec-Bench's MT-bench "
                         "items have two); split the conversation")
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, str):
            raise ValueError(f"{where} has turn {i} of type {type(turn).__name__} ({turn!r}): each turn is a string")
        if not turn.strip():
            raise ValueError(f"{where} has an empty turn {i}: give it some text or remove it")
        check_unicode(f"turn {i} of {where}", turn)
    check_unicode(f"the category of {where}", category)
    return str(qid), category, tuple(turns)


def parse_jsonl(path: Path) -> list[Prompt]:
    """Every item of a Spec-Bench-style JSONL file, in file order (blank lines skipped)."""
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(_read(path).split("\n"), 1):  # not splitlines: a raw U+2028 may sit inside a string
        if not line.strip():
            continue
        where = f"line {n} of {str(path)!r}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not valid JSON ({err.msg} at column {err.colno}): write {ALLOWED}") from None
        except RecursionError:
            raise ValueError(f"{where} nests too deep to read: write {ALLOWED}") from None
        qid, category, turns = _item(entry, where)
        if qid in seen:
            raise ValueError(f"question_id {qid!r} appears twice in {str(path)!r} (lines {seen[qid]} and {n}): "
                             "question ids must be unique")
        seen[qid] = n
        prompts.append(Prompt(qid, category, turns[0], turns, chat=True))
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} holds no items: write {ALLOWED}")
    return prompts
