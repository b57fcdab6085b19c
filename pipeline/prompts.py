"""The prompt set: texts with an id and a kind, tokenised for a pair."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

PROMPT_DIR = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    text: str


def load_prompts(file: str, kinds: list[str], per_kind: int = 0) -> list[Prompt]:
    """Prompts from ``file`` (a name in pipeline/prompts/ or a path), filtered to ``kinds``."""
    path = Path(file) if Path(file).is_file() else PROMPT_DIR / file
    if not path.is_file():
        shipped = sorted(p.name for p in PROMPT_DIR.glob("*.yaml"))
        raise ValueError(f"prompt file {file!r} not found: use one of {shipped} or a path to a YAML file")
    prompts = [Prompt(str(p["id"]), str(p["kind"]), str(p["text"])) for p in yaml.safe_load(path.read_text()) or []]
    available = sorted({p.kind for p in prompts})
    unknown = [k for k in kinds if k not in available]
    if unknown:
        raise ValueError(f"prompt kinds {unknown} not in {path.name}: allowed are {available}")
    chosen: list[Prompt] = []
    for kind in kinds:
        of_kind = [p for p in prompts if p.kind == kind]
        chosen += of_kind[:per_kind] if per_kind > 0 else of_kind
    if not chosen:
        raise ValueError(f"the prompt set is empty: {path.name} has no prompt of kinds {list(kinds)}")
    return chosen


def encode(prompt: Prompt, tokenizer, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Token ids [1, n]. Without a tokenizer (tiny random models) the text's bytes stand in for tokens."""
    if tokenizer is None:
        ids = [b % vocab_size for b in prompt.text.encode()[:64]]
        return torch.tensor([ids], device=device)
    return tokenizer(prompt.text, return_tensors="pt").input_ids.to(device)
