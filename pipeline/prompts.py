"""The prompt set: texts with an id and a kind, checked and tokenised for a pair."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

PROMPT_DIR = Path(__file__).parent / "prompts"
FIELDS = ("id", "kind", "text")
STAND_IN_TOKENS = 64


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    text: str


def _parse(path: Path) -> list[Prompt]:
    """Every prompt of a file, or a one-line ValueError saying what is wrong and where."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(f"prompt file {str(path)!r} is not valid YAML{where} ({problem})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"prompt file {str(path)!r} cannot be read ({type(err).__name__})") from None
    if not data:
        raise ValueError(f"prompt file {str(path)!r} holds no prompts: write a YAML list of entries with {list(FIELDS)}")
    if not isinstance(data, list):
        raise ValueError(f"prompt file {str(path)!r} holds a {type(data).__name__}: write a YAML list of entries "
                         f"with {list(FIELDS)}")
    prompts, seen = [], {}
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict):
            raise ValueError(f"prompt #{i} in {path.name} is {entry!r}: each prompt is a mapping with {list(FIELDS)}")
        name = f"prompt #{i}" + (f" (id {entry['id']!r})" if entry.get("id") is not None else "")
        missing = [f for f in FIELDS if entry.get(f) is None]
        if missing:
            raise ValueError(f"{name} in {path.name} lacks {missing}: each prompt needs {list(FIELDS)}")
        if not isinstance(entry["text"], str):
            raise ValueError(f"{name} in {path.name} has a text of type {type(entry['text']).__name__} "
                             f"({entry['text']!r}): write the text as a string (quote it)")
        odd = [f for f in ("id", "kind") if not isinstance(entry[f], (str, int)) or isinstance(entry[f], bool)]
        if odd:
            raise ValueError(f"{name} in {path.name} has a {odd[0]!r} of type {type(entry[odd[0]]).__name__}: "
                             f"use a name (a string)")
        pid, kind, text = (str(entry[f]) for f in FIELDS)
        _check_unicode(f"prompt {pid!r} in {path.name}", text)
        if not pid.strip() or not kind.strip():
            raise ValueError(f"{name} in {path.name} has an empty id or kind: both must be non-empty")
        if not text.strip():
            raise ValueError(f"prompt {pid!r} in {path.name} has an empty text: give it some text or remove it")
        if pid in seen:
            raise ValueError(f"prompt id {pid!r} appears twice in {path.name} (#{seen[pid]} and #{i}): ids must be unique")
        seen[pid] = i
        prompts.append(Prompt(pid, kind, text))
    return prompts


def _check_unicode(name: str, text: str) -> None:
    """A lone surrogate (YAML "\\ud800") cannot be encoded: say where, instead of failing in the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} has an invalid character {text[err.start]!r} at position {err.start + 1} "
                         "(a lone surrogate): texts must be valid Unicode") from None


def load_prompts(file: str, kinds: list[str], per_kind: int = 0, skip_per_kind: int = 0) -> list[Prompt]:
    """Prompts from ``file`` (a name in pipeline/prompts/ or a path), filtered to ``kinds``.

    ``skip_per_kind`` leaves out the first n of each kind, then ``per_kind`` keeps the first n of the
    rest (0: all): a plan on ``per_kind=2`` and a check on ``skip_per_kind=2`` use disjoint prompts.
    """
    if per_kind < 0:
        raise ValueError(f"prompts.per_kind={per_kind} is not allowed: use 0 (every prompt) or n >= 1")
    if skip_per_kind < 0:
        raise ValueError(f"prompts.skip_per_kind={skip_per_kind} is not allowed: use an integer >= 0")
    path = Path(file) if Path(file).is_file() else PROMPT_DIR / file
    if not path.is_file():
        shipped = sorted(p.name for p in PROMPT_DIR.glob("*.yaml"))
        raise ValueError(f"prompt file {file!r} not found: use one of {shipped} or a path to a YAML file")
    prompts = _parse(path)
    available = sorted({p.kind for p in prompts})
    unknown = [k for k in kinds if k not in available]
    if unknown:
        raise ValueError(f"prompt kinds {unknown} not in {path.name}: allowed are {available}")
    chosen: list[Prompt] = []
    for kind in kinds:
        of_kind = [p for p in prompts if p.kind == kind]
        if skip_per_kind >= len(of_kind):
            raise ValueError(f"prompts.skip_per_kind={skip_per_kind} leaves no prompt of kind {kind!r}: {path.name} has "
                             f"{len(of_kind)} of that kind; use prompts.skip_per_kind < {len(of_kind)}")
        of_kind = of_kind[skip_per_kind:]
        chosen += of_kind[:per_kind] if per_kind > 0 else of_kind
    if not chosen:
        raise ValueError(f"the prompt set is empty: {path.name} has no prompt of kinds {list(kinds)}")
    return chosen


def encode(prompt: Prompt, tokenizer, vocab_size: int, device: torch.device,
           limits: dict[str, int | None] | None = None) -> torch.Tensor:
    """Token ids [1, n]. Without a tokenizer (tiny random models) the text's bytes stand in for tokens and the
    first ``STAND_IN_TOKENS`` of them are read (tiny models' prompts stay short); a text with more bytes than
    a model's context (``limits``: role -> context) is refused all the same, as a tokenised one would be."""
    if tokenizer is None:
        data = prompt.text.encode()
        for role, limit in (limits or {}).items():
            if limit is not None and len(data) > limit:
                raise ValueError(f"prompt {prompt.id!r} has {len(data)} bytes (a tokenizer-less model's tokens), more "
                                 f"than the {role}'s context of {limit}: shorten the prompt")
        return torch.tensor([[b % vocab_size for b in data[:STAND_IN_TOKENS]]], device=device)
    ids = tokenizer(prompt.text, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise ValueError(f"prompt {prompt.id!r} encodes to no tokens: give it some text")
    return ids.to(device)


def check_fits(prompt_id: str, n_prompt: int, max_new_tokens: int, k_max: int, limits: dict[str, int | None]) -> None:
    """The prompt, the new tokens and one iteration's proposals must fit every model's context."""
    need = n_prompt + max_new_tokens + k_max + 1
    for role, limit in limits.items():
        if limit is not None and need > limit:
            raise ValueError(f"prompt {prompt_id!r} has {n_prompt} tokens: with max_new_tokens={max_new_tokens} and "
                             f"up to k={k_max} proposals it needs {need} positions, more than the {role}'s context of "
                             f"{limit}; shorten the prompt or lower max_new_tokens")
