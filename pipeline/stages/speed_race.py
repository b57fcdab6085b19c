"""Which arms the speed stage runs in the next block of a kind, and why each arm's runs stopped.

With neither ``stage.race`` nor ``stage.precision`` every kind runs ``stage.rounds`` rounds (``FIXED``). With either,
``stage.rounds`` (and ``stage.budget_minutes``) is the budget: after each block of a kind the race
(``speclab.stats.racing.look``) may drop arms clearly slower than the leader and may stop the kind, decided or precise
enough. Every arm keeps the rows of the blocks it ran; its ``stopped_by`` says why it has no more.
"""
from __future__ import annotations

import math
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from speclab.stats.racing import DECIDED, PRECISION, RaceRule, look

FIXED = "rounds"  # every block of stage.rounds ran: the fixed design (and every result stored before racing)
BUDGET_ROUNDS, BUDGET_MINUTES = "budget: rounds", "budget: minutes"
# "decided" ranks the arms by the mean of their paired log speed-ups (a t bound); the verdict reads the median's
# distribution-free interval over plain, so a decided kind can still be unclear against plain: the line says so.
STOPS = {DECIDED: "decided: every other arm clearly slower than the leader (by the mean; whether it beats plain is "
                  "the verdict's interval)",
         PRECISION: "precision reached"}


@dataclass
class KindRace:
    """One kind's race: the arms still running (plain always), their per-block log speed-ups, who left and why."""
    running: list[Hashable]
    ys: dict[Hashable, list[float]] = field(default_factory=dict)
    plain_in: bool = True
    dropped: dict[Hashable, str] = field(default_factory=dict)
    stop: str | None = None
    blocks: int = 0


class Race:
    """The stage's schedule over kinds: ``arms_for(kind)`` before a block, ``record`` after it, ``finish`` after the
    last round, then ``stopped_by`` for each row."""

    def __init__(self, arms: list[Hashable], plain: Hashable, prompts_per_kind: dict[str, int], rounds: int,
                 race: bool, precision: float | None, level: float, budget_minutes: float | None,
                 name=lambda arm, kind: str(arm)) -> None:
        """``name(arm, kind)``: how a reason names an arm (the plan's choice names its configuration for the kind)."""
        self.sequential = race or precision is not None
        self.arms, self.plain, self.name = list(arms), plain, name
        self.budget_minutes, self.started = budget_minutes, time.monotonic()
        # A kind is looked at after each round over its prompts: every look sees each prompt equally often.
        self.rules = {kind: RaceRule(level, rounds * n, race, precision, every=n) for kind, n in prompts_per_kind.items()}
        self.kinds = {kind: KindRace(list(arms)) for kind in prompts_per_kind}

    def arms_for(self, kind: str) -> list[Hashable]:
        """The arms of the next block of ``kind`` in the stage's order (empty: the kind has stopped)."""
        k = self.kinds[kind]
        if k.stop is None and self.sequential and self.budget_minutes is not None and \
                time.monotonic() - self.started >= 60 * self.budget_minutes:
            for other in self.kinds.values():
                other.stop = other.stop or BUDGET_MINUTES
        return [] if k.stop else [a for a in self.arms if a in k.running]

    def record(self, kind: str, speedups: dict[Hashable, float]) -> list[str]:
        """A finished block's speed-ups over its plain run (plain's is 1); the lines saying what the look decided."""
        k = self.kinds[kind]
        k.blocks += 1
        for arm, s in speedups.items():
            k.ys.setdefault(arm, []).append(math.log(s))
        if not self.sequential or not self.rules[kind].looks_at(k.blocks):
            return []
        in_race = {a: np.array(k.ys[a]) for a in k.running if a != self.plain or k.plain_in}
        name = lambda arm: self.name(arm, kind)  # noqa: E731
        seen = look(in_race, self.plain, self.rules[kind], len(self.arms), name)
        lines = []
        for arm, why in seen.dropped.items():
            k.dropped[arm] = f"dropped: {why}"
            if arm == self.plain:
                k.plain_in = False
            else:
                k.running.remove(arm)
            lines.append(f"speed race, {kind}: {name(arm)} {k.dropped[arm]}")
        if seen.stop:
            k.stop = seen.stop
            lines.append(f"speed race, {kind}: stops after {k.blocks} blocks, {STOPS[seen.stop]} "
                         f"(leader {name(seen.leader)})")
        return lines

    def finish(self) -> None:
        """After the last round: every kind still going ran out of rounds."""
        for k in self.kinds.values():
            k.stop = k.stop or (BUDGET_ROUNDS if self.sequential else FIXED)

    def stopped_by(self, kind: str, arm: Hashable) -> str:
        k = self.kinds[kind]
        return k.dropped.get(arm) if arm != self.plain and arm in k.dropped else STOPS.get(k.stop, k.stop or FIXED)
