"""One item of a workload: an id, a kind and its user turns (a shipped text, or a Spec-Bench question)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_TURNS = 2  # Spec-Bench's MT-bench items have two user turns; nothing longer is run


@dataclass(frozen=True)
class Prompt:
    """A prompt as every stage sees it (stages read ``id`` and ``kind``; the context is built from ``turns``).

    ``text`` is the first (for YAML sets the only) user turn, so code that encodes a single text keeps
    working; ``turns`` holds every user turn (``()`` stands for ``(text,)``). ``chat`` marks a conversation
    item (a JSONL question), which ``prompts.chat_template=auto`` puts through the tokenizer's chat template;
    the YAML sets are continuation texts and stay raw under auto. ``category`` is the file's own category
    when kinds pool (``mt_bench``), else the kind.
    """

    id: str
    kind: str
    text: str
    turns: tuple[str, ...] = ()
    chat: bool = False
    category: str = ""

    def __post_init__(self) -> None:
        if not self.turns:
            object.__setattr__(self, "turns", (self.text,))
        if not self.category:
            object.__setattr__(self, "category", self.kind)


def check_unicode(name: str, text: str) -> None:
    """A lone surrogate (YAML or JSON "\\ud800") cannot be encoded: say where, instead of failing in the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} has an invalid character {text[err.start]!r} at position {err.start + 1} "
                         "(a lone surrogate): texts must be valid Unicode") from None
