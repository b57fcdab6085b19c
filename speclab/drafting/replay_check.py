"""A replay (``speclab.drafting.replay``) against the real loop's iterations: how many agree, and the first that does not.

Greedy replay is exact up to floating point: where the target's (or the draft's) two best logits are
a near-tie, the loop's multi-token passes can pick the other token than the plain step or the draft's
reference steps did, and a dynamically quantized draft's multi-token calls are not its steps. From the
first such iteration on, both sides follow different texts (and a k policy different choices), so the
count of differing iterations is reported together with the first one and what differed there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speclab.decoding.loop import GenerationResult, IterationStats
from speclab.drafting.replay import Replay
from speclab.decoding.step import Run, Step

# What both sides record per iteration; draft_fed / draft_calls only where one row ran (a batch's are
# the widest row's).
FIELDS = ("length", "proposed", "accepted", "new_tokens", "draft_fed", "draft_calls")


@dataclass(frozen=True)
class Agreement:
    agree: int  # iterations equal in every compared field
    differ: int  # iterations that differ, counting those only one side has
    first_difference: int | None  # index of the first differing iteration (None: none)
    detail: str  # what differed there, e.g. "accepted: replay 2, loop 1"
    tokens_equal: bool | None  # the replay's output equals the loop's (None: the loop's was not given)

    @property
    def exact(self) -> bool:
        return self.differ == 0 and self.tokens_equal is not False


def loop_iterations(run: GenerationResult | Run | Sequence[IterationStats] | Sequence[Step],
                    row: int = 0) -> list[dict[str, int]]:
    """The loop's per-iteration records in the replay's terms; a ``Run`` gives prompt ``row``'s.

    A replay is a batch-1 run: in a batch the proposal cap is the least advanced row's, so a row near
    its budget may propose more than it would alone (its block is cut afterwards), and the draft's
    first-call width is the widest row's (not compared)."""
    steps = run.iterations if isinstance(run, GenerationResult) else run.steps if isinstance(run, Run) else run
    row_ids = run.row_ids if isinstance(run, Run) else None
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, IterationStats):
            out.append({"length": s.length, "proposed": s.k, "accepted": s.accepted, "new_tokens": s.new_tokens,
                        "draft_fed": s.draft_fed, "draft_calls": s.draft_calls})
            continue
        ids = row_ids[i] if row_ids else list(range(len(s.counts)))
        if row not in ids:
            continue  # that row had finished
        b = ids.index(row)
        rec = {"length": s.lengths[b], "proposed": s.counts[b], "accepted": s.accepted[b],
               "new_tokens": s.final[b] - s.lengths[b]}
        if len(s.counts) == 1:
            rec.update(draft_fed=s.draft_fed, draft_calls=s.draft_calls)
        out.append(rec)
    return out


def differences(replayed: Replay, loop: list[dict[str, int]]) -> list[list[str]]:
    """Per loop iteration (``loop_iterations``), the fields where the replay's iteration differs ([]: equal;
    a loop iteration the replay lacks differs in every field)."""
    out = []
    for i, rec in enumerate(loop):
        r = replayed.steps[i] if i < len(replayed.steps) else None
        out.append([f"{f}: replay {None if r is None else getattr(r, f)}, loop {rec[f]}" for f in FIELDS
                    if f in rec and (r is None or getattr(r, f) != rec[f])])
    return out


def compare(replayed: Replay, run: GenerationResult | Run | Sequence[IterationStats] | Sequence[Step],
            row: int = 0, tokens: list[int] | None = None) -> Agreement:
    """Replayed iterations against the loop's, field by field (``FIELDS`` that the loop recorded).

    ``tokens``: the loop's output, when ``run`` does not carry it (a GenerationResult and a Run do)."""
    loop = loop_iterations(run, row)
    if tokens is None and isinstance(run, GenerationResult):
        tokens = run.tokens
    elif tokens is None and isinstance(run, Run) and run.tokens:
        tokens = run.tokens[row]
    agree, first, detail = 0, None, ""
    for i, diff in enumerate(differences(replayed, loop[: len(replayed.steps)])):
        if diff:
            first, detail = (i, "; ".join(diff)) if first is None else (first, detail)
        else:
            agree += 1
    n = max(len(replayed.steps), len(loop))
    if first is None and len(replayed.steps) != len(loop):
        first = min(len(replayed.steps), len(loop))
        detail = f"iterations: replay {len(replayed.steps)}, loop {len(loop)}"
    return Agreement(agree, n - agree, first, detail, None if tokens is None else tokens == replayed.tokens)
