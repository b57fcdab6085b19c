"""The prompt set: items with an id and a kind (YAML texts or Spec-Bench JSONL questions), selected,
checked and tokenised for a pair."""
from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

import torch
import yaml

from pipeline.prompts.prompt_files import MAX_NESTING, is_jsonl, parse_jsonl, too_deep
from pipeline.prompts.prompt import Prompt, check_unicode
from speclab.specs.prompt_pools import MT_BENCH, POOLS

__all__ = ["Prompt", "load_prompts", "read_file", "shipped_files", "encode", "check_fits", "check_window",
           "MT_BENCH", "POOLS", "STAND_IN_TOKENS"]

PROMPT_DIR = Path(__file__).parent
FIELDS = ("id", "kind", "text")
STAND_IN_TOKENS = 64


def _parse(path: Path) -> list[Prompt]:
    """Every prompt of a file, or a one-line ValueError saying what is wrong and where."""
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(f"prompt file {str(path)!r} is not valid YAML{where} ({problem})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"prompt file {str(path)!r} cannot be read ({type(err).__name__})") from None
    except RecursionError:  # the parser recurses once per level of nesting
        line = too_deep(text)
        where = f" (more than {MAX_NESTING} brackets deep at line {line})" if line else ""
        raise ValueError(f"prompt file {str(path)!r} nests too deep to read{where}: write a YAML list of entries "
                         f"with {list(FIELDS)}") from None
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
        check_unicode(f"prompt {pid!r} in {path.name}", text)
        if not pid.strip() or not kind.strip():
            raise ValueError(f"{name} in {path.name} has an empty id or kind: both must be non-empty")
        if not text.strip():
            raise ValueError(f"prompt {pid!r} in {path.name} has an empty text: give it some text or remove it")
        if pid in seen:
            raise ValueError(f"prompt id {pid!r} appears twice in {path.name} (#{seen[pid]} and #{i}): ids must be unique")
        seen[pid] = i
        prompts.append(Prompt(pid, kind, text))
    return prompts


def shipped_files() -> list[str]:
    """The prompt files shipped in pipeline/prompts/ (names ``prompts.file`` takes)."""
    return sorted(str(p.relative_to(PROMPT_DIR)) for ext in ("yaml", "jsonl") for p in PROMPT_DIR.rglob(f"*.{ext}"))


def read_file(file: str) -> tuple[Path, list[Prompt]]:
    """The prompt file ``file`` (a name in pipeline/prompts/ or a path) and its items: ``.jsonl`` (in any case)
    in Spec-Bench's schema, anything else the YAML list of texts."""
    path = Path(file) if Path(file).is_file() else PROMPT_DIR / file
    if not path.is_file():
        raise ValueError(f"prompt file {file!r} not found: use one of {shipped_files()} or a path to a YAML or "
                         "JSONL file")
    return path, (parse_jsonl(path) if is_jsonl(path) else _parse(path))


def _pooled(prompts: list[Prompt], kind: str) -> list[Prompt]:
    """The items of a pooled kind (``mt_bench``), renamed to it, taken in turn from each member category
    (each in file order): the first n of the pool then cover its categories, whatever n is."""
    groups = [[p for p in prompts if p.kind == member] for member in POOLS[kind]]
    return [replace(p, kind=kind) for row in zip_longest(*groups) for p in row if p is not None]


def _available(prompts: list[Prompt]) -> list[str]:
    kinds = {p.kind for p in prompts}
    return sorted(kinds | {pool for pool, members in POOLS.items() if kinds & set(members)})


def load_prompts(file: str, kinds: list[str], per_kind: int = 0, skip_per_kind: int = 0) -> list[Prompt]:
    """Prompts from ``file`` (a name in pipeline/prompts/ or a path), filtered to ``kinds``.

    A kind is a file's kind (a JSONL category), or a pool of them (``mt_bench``: MT-bench's eight
    subcategories) when the file has no kind of that name. The sample is a fixed function of the file:
    ``skip_per_kind`` leaves out the first n of each kind, then ``per_kind`` keeps the first n of the rest
    (0: all), in file order (a pool: its categories in turn), so a plan on ``per_kind=2`` and a check on
    ``skip_per_kind=2`` use disjoint prompts.
    """
    if per_kind < 0:
        raise ValueError(f"prompts.per_kind={per_kind} is not allowed: use 0 (every prompt) or n >= 1")
    if skip_per_kind < 0:
        raise ValueError(f"prompts.skip_per_kind={skip_per_kind} is not allowed: use an integer >= 0")
    path, prompts = read_file(file)
    own = {p.kind for p in prompts}
    available = _available(prompts)
    unknown = [k for k in kinds if k not in available]
    if unknown:
        raise ValueError(f"prompt kinds {unknown} not in {path.name}: allowed are {available}")
    pooled = [k for k in kinds if k not in own]
    for pool in pooled:  # a category asked for twice would run its prompts twice
        twice = [k for k in kinds if k in POOLS[pool]]
        if twice:
            raise ValueError(f"prompt kinds {[pool, *twice]} overlap: {pool} pools {list(POOLS[pool])}; "
                             f"choose {pool} or its categories, not both")
    if len(set(kinds)) < len(kinds):
        raise ValueError(f"prompts.kinds={list(kinds)} names a kind twice: name each once")
    chosen: list[Prompt] = []
    for kind in kinds:
        of_kind = _pooled(prompts, kind) if kind in pooled else [p for p in prompts if p.kind == kind]
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


def check_fits(prompt_id: str, n_prompt: int, max_new_tokens: int, k_max: int, limits: dict[str, int | None],
               name: str | None = None) -> None:
    """The prompt, the new tokens and one iteration's proposals must fit every model's context (``name``: how
    the error calls the prompt, default ``prompt 'ID'``)."""
    need = n_prompt + max_new_tokens + k_max + 1
    for role, limit in limits.items():
        if limit is not None and need > limit:
            raise ValueError(f"{name or f'prompt {prompt_id!r}'} has {n_prompt} tokens: with max_new_tokens="
                             f"{max_new_tokens} and up to k={k_max} proposals it needs {need} positions, more than the {role}'s context of "
                             f"{limit}; shorten the prompt or lower max_new_tokens")


def check_window(prompt_id: str, n_prompt: int, max_new_tokens: int, k_max: int, rows: int,
                 windows: dict[str, int | None], name: str | None = None) -> None:
    """A batch of several rows is exact on a sliding-window model only while its width stays within the window
    (speclab/decoding/batch_cache.py refuses mid-run otherwise); a batch is at least as wide as its longest row, so a
    prompt whose own run would pass the window is refused before any compute."""
    if rows <= 1:
        return  # one row keeps a dense layout: exact past the window (tests/test_loop_sliding_window.py)
    need = n_prompt + max_new_tokens + k_max + 1
    for role, window in windows.items():
        if window is not None and need > window:
            raise ValueError(f"{name or f'prompt {prompt_id!r}'} has {n_prompt} tokens: with max_new_tokens="
                             f"{max_new_tokens} and up to k={k_max} proposals a batch of {rows} rows is {need} columns "
                             f"wide, more than the {role}'s sliding window of {window} (not exact past it); use stage.batch_sizes=[1], "
                             "shorter prompts or a lower max_new_tokens")
