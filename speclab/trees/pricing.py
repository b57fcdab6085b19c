"""Pricing an iteration from the passes it ran: the draft model's calls by width and the target's pass.

A tree iteration runs one draft call per depth (the first catches up on the context, each later one feeds a
level of nodes, as wide as the level) and one target pass over the pending token(s) and every node; a chain
iteration is the same with one-node levels. Priced in target steps (a one-token target pass after the
context), an iteration costs sum_calls c_draft(width) + c_verify(nodes + 1), and the speed-up over plain
decoding, which pays one target step per token, is the tokens the iterations produced over that sum. The
costs come from timed passes (stage timing: ``draft`` and ``target`` rows for chains, ``target_tree`` for the
tree mask's path) and the counts from the runs themselves, so depth, shape, EOS and budget cuts are what
they were. Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def parse_counts(text: str | None) -> dict[int, int]:
    """``"1:12,3:4"`` -> {1: 12, 3: 4} (the speed stage's ``draft_calls_by_width`` / ``passes_by_width``)."""
    if not text or text != text:
        return {}
    out = {}
    for part in str(text).split(","):
        width, _, count = part.partition(":")
        out[int(width)] = out.get(int(width), 0) + int(count)
    return out


@dataclass(frozen=True)
class CostCurve:
    """Seconds of a pass by its width (new tokens), interpolated linearly and extended by the last segment."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_table(cls, table: dict[int, float]) -> "CostCurve":
        if not table:
            raise ValueError("a cost curve needs at least one timed width")
        keys = sorted(table)
        return cls(tuple(keys), tuple(float(table[k]) for k in keys))

    def __call__(self, width: float) -> float:
        w, s = np.array(self.widths, float), np.array(self.seconds, float)
        if len(w) > 1 and width > w[-1]:
            return float(s[-1] + (s[-1] - s[-2]) / (w[-1] - w[-2]) * (width - w[-1]))
        return float(np.interp(width, w, s))


def priced_seconds(calls: dict[int, int], passes: dict[int, int], draft: CostCurve, verify: CostCurve) -> float:
    """The seconds a run's loop should take: every draft call and every target pass at its timed cost."""
    return (sum(n * draft(w) for w, n in calls.items()) + sum(n * verify(w) for w, n in passes.items()))


def predicted_speedup(calls: dict[int, int], passes: dict[int, int], tokens: int, draft: CostCurve,
                      verify: CostCurve, step_s: float) -> float:
    """Tokens per second of the priced loop over plain decoding's (one target step of ``step_s`` a token)."""
    spent = priced_seconds(calls, passes, draft, verify)
    return float("nan") if spent <= 0 or tokens <= 0 else tokens * step_s / spent
