"""From a prompt's user turns (and the model's stored answers to the earlier ones) to the token ids a run
starts from: through the tokenizer's chat template, or joined plainly.

``prompts.chat_template``: ``on`` puts every prompt through the template (a tokenizer without one is an
error), ``off`` never, ``auto`` (the default) puts conversation items (JSONL questions) through it where the
tokenizer has one and leaves the shipped YAML texts raw: those are beginnings to continue, and every stored
result of the project was measured on them raw.

Joined plainly (no template, or a tokenizer-less tiny model): the user turns and the answers in between,
in order, separated by one blank line (``PLAIN_JOIN``). Without a tokenizer, a turn's UTF-8 bytes stand in
for its tokens (the first ``STAND_IN_TOKENS`` of them, as for one text), an answer is its token ids, and
the separator is its two bytes. A one-turn prompt joined plainly is exactly what ``encode`` gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.prompts.prompt import Prompt
from pipeline.prompts.sets import encode

SETTINGS = ("auto", "on", "off")
PLAIN_JOIN = "\n\n"


@dataclass(frozen=True)
class Answer:
    """The model's answer to an earlier user turn: its token ids and (with a tokenizer) its decoded text."""
    ids: tuple[int, ...]
    text: str | None = None


def has_template(tokenizer: Any | None) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def uses_template(setting: str, tokenizer: Any | None, prompt: Prompt) -> bool:
    """Whether ``prompt`` goes through the chat template under ``prompts.chat_template=setting``."""
    if setting not in SETTINGS:
        raise ValueError(f"prompts.chat_template={setting!r} is not allowed: use one of {list(SETTINGS)} "
                         "(quote on/off in YAML files, which read them as booleans)")
    if setting == "off":
        return False
    if setting == "on":
        if not has_template(tokenizer):
            what = "a tokenizer-less model has none" if tokenizer is None else "its tokenizer has none"
            raise ValueError(f"prompts.chat_template='on' is not allowed with this pair: {what}; use auto or off")
        return True
    return prompt.chat and has_template(tokenizer)


def messages(turns: tuple[str, ...], answers: list[Answer]) -> list[dict[str, str]]:
    """The conversation as chat messages: user turn, assistant answer, user turn, ..."""
    out: list[dict[str, str]] = []
    for i, turn in enumerate(turns):
        out.append({"role": "user", "content": turn})
        if i < len(turns) - 1:
            out.append({"role": "assistant", "content": answers[i].text or ""})
    return out


def _check_answers(prompt: Prompt, turns: tuple[str, ...], answers: list[Answer]) -> None:
    if len(answers) != len(turns) - 1:
        raise ValueError(f"prompt {prompt.id!r}: {len(turns)} turns need {len(turns) - 1} earlier answers, "
                         f"got {len(answers)}")


def _plain_ids(prompt: Prompt, turns: tuple[str, ...], answers: list[Answer], vocab_size: int,
               device: torch.device, limits: dict[str, int | None] | None) -> torch.Tensor:
    """Tokenizer-less: bytes of each turn (as ``encode`` reads one text), answer ids, separator bytes between."""
    sep = [b % vocab_size for b in PLAIN_JOIN.encode()]
    ids: list[int] = []
    for i, turn in enumerate(turns):
        ids += encode(Prompt(prompt.id, prompt.kind, turn), None, vocab_size, device, limits)[0].tolist()
        if i < len(turns) - 1:
            ids += sep + list(answers[i].ids) + sep
    return torch.tensor([ids], device=device)


def conversation_ids(prompt: Prompt, turns: tuple[str, ...], answers: list[Answer], tokenizer: Any | None,
                     template: bool, vocab_size: int, device: torch.device,
                     limits: dict[str, int | None] | None = None) -> torch.Tensor:
    """Token ids [1, n] of ``turns`` (a prefix of ``prompt.turns``) with ``answers`` to all but the last, ready
    for the model to answer the last turn."""
    _check_answers(prompt, turns, answers)
    if tokenizer is None:
        return _plain_ids(prompt, turns, answers, vocab_size, device, limits)
    if template:
        text = tokenizer.apply_chat_template(messages(turns, answers), tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids  # the template has them
    else:
        pieces = [piece for i, turn in enumerate(turns)
                  for piece in ([turn] if i == len(turns) - 1 else [turn, answers[i].text or ""])]
        ids = tokenizer(PLAIN_JOIN.join(pieces), return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise ValueError(f"prompt {prompt.id!r} encodes to no tokens: give it some text")
    return ids.to(device)
