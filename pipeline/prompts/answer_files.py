"""A stored first answer of a two-turn prompt: one JSON file, written with a content hash and checked whenever
it is read.

The hash is the sha256 of the file's record without the hash itself (canonical JSON): the answer's ids and
text and what it answers. A file that differs from its hash, holds no usable answer, ids outside the target's
vocabulary or more ids than the ``max_new_tokens`` it was generated with, or says it answers something else, is
a one-line error naming the file and the prompt. A file written before hashes were stored is checked the same
way but for the hash, and hashed as read; the job's provenance records the hash either way.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.prompts.chat import Answer
from store.files import atomic_write_text

HASH = "content_sha256"
# What a file says it answers, checked against the job's own values (written with every stored answer).
ABOUT = ("prompt_id", "target", "dtype", "max_new_tokens", "chat_template", "context_tokens")


@dataclass(frozen=True)
class StoredAnswer:
    answer: Answer
    sha256: str  # the content hash (stored in the file, or computed as read for an older file)
    hash_in_file: bool


def content_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != HASH}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def write_answer(path: Path, about: dict[str, Any], ids: list[int], text: str | None) -> StoredAnswer:
    record = {**about, "answer_ids": ids, "answer_text": text}
    record[HASH] = content_hash(record)
    atomic_write_text(path, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return StoredAnswer(Answer(tuple(ids), text), record[HASH], True)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _problem(record: Any, about: dict[str, Any], vocab: int, needs_text: bool) -> str | None:
    """What makes ``record`` unusable as the answer ``about`` describes; None when it is usable."""
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not an answer record"
    if HASH in record and record[HASH] != content_hash(record):
        return (f"does not match its {HASH} (its ids, text or description were changed after it was written: "
                f"found {_shown(record[HASH])})")
    ids = record.get("answer_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return f"has answer_ids={_shown(ids)}, not a list of integer token ids"
    limit = about["max_new_tokens"]
    if len(ids) > limit:
        return (f"holds {len(ids):,} answer ids, more than the max_new_tokens={limit} the answer was generated "
                "with")
    bad = next(((n, i) for n, i in enumerate(ids) if not 0 <= i < vocab), None)
    if bad is not None:
        return f"holds token id {bad[1]} (answer_ids[{bad[0]}]), outside the target's vocabulary 0..{vocab - 1}"
    text = record.get("answer_text")
    if needs_text and not isinstance(text, str):
        return f"has answer_text={_shown(text)}, not the answer's text (this target has a tokenizer)"
    if not needs_text and text is not None:
        return f"has answer_text={_shown(text)}: a tokenizer-less target's answer is its ids, with answer_text null"
    for key in ABOUT:
        if key in record and record[key] != about[key]:
            return f"says {key}={_shown(record[key])}, but this job's answer has {key}={_shown(about[key])}"
    return None


def read_answer(path: Path, about: dict[str, Any], vocab: int, needs_text: bool) -> StoredAnswer:
    """The answer stored in ``path``, checked (see the module docstring); ``about``: what it must answer
    (``ABOUT``'s keys), ``vocab``: the target's vocabulary size, ``needs_text``: whether the target has a
    tokenizer."""
    where = f"stored answer {str(path)!r} (the first turn of prompt {about['prompt_id']!r})"
    fix = ("delete the file to have the answer generated again, or restore the original "
           "(in a published campaign: from git)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{where} cannot be read ({err.strerror or type(err).__name__}): {fix}") from None
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{where} is not valid JSON ({type(err).__name__}): {fix}") from None
    problem = _problem(record, about, vocab, needs_text)
    if problem is not None:
        raise ValueError(f"{where} {problem}: {fix}")
    text = record["answer_text"]
    return StoredAnswer(Answer(tuple(record["answer_ids"]), text), content_hash(record), HASH in record)
