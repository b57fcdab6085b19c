"""Greedy acceptance replayed: the loop's iterations at any k or k policy, without running the loop.

Greedy speculative output is the target's plain greedy output, so every decision the loop takes
follows from two sequences: the target's greedy tokens and, for a draft model, the draft's greedy
choice at every position of that text (one step a token: ``speclab.drafting.replay_reference``).
A greedy draft's proposals equal the target's tokens up to its first disagreement (it continues its
own proposals, which are the target's while they match), so an iteration at length L with c model
proposals accepts the number of consecutive positions from L where the draft's choice equals the
target's token, at most c. A prompt-lookup proposal is a copy of the text so far, accepted up to its
first difference from the target's tokens. The rest (the k policy and its labels, the proposal cap,
EOS and the token budget, the draft model's catch-up) is decided here as ``speclab.decoding.step`` decides it
for a batch of one row; ``speclab.drafting.replay_check`` compares the two iteration by iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np
import torch

from speclab.decoding.acceptance import checked_proposals
from speclab.decoding.checks import eos_ids
from speclab.decoding.drafters import HybridDrafter, PromptLookupDrafter, continuation, declared, lookup_match
from speclab.decoding.k_policy import KPolicy, RowPolicies
from speclab.decoding.rows import check_budget
from speclab.costs.time_model import Trace

MODEL, LOOKUP, HYBRID = "model", "prompt_lookup", "hybrid"


@dataclass(frozen=True)
class ReplayDrafter:
    """Which drafter the replayed loop runs, with the settings that change its proposals."""

    kind: str = MODEL  # "model", "prompt_lookup" or "hybrid"
    max_ngram: int = 3
    min_ngram: int = 1
    min_match: int = 1  # hybrid: the shortest lookup continuation used instead of the model

    def __post_init__(self) -> None:
        if self.kind not in (MODEL, LOOKUP, HYBRID):
            raise ValueError(f"kind={self.kind!r} is not allowed: use {MODEL!r}, {LOOKUP!r} or {HYBRID!r}")
        PromptLookupDrafter(self.max_ngram, self.min_ngram)  # the drafters' own checks, same messages
        if self.min_match < 1:
            raise ValueError(f"min_match={self.min_match} is not allowed: use an integer >= 1")

    @property
    def uses_model(self) -> bool:
        return self.kind in (MODEL, HYBRID)

    @property
    def uses_lookup(self) -> bool:
        return self.kind in (LOOKUP, HYBRID)

    @classmethod
    def of(cls, drafter: object) -> "ReplayDrafter":
        """The replay's description of a loop drafter, as its class declares it (``replay_as``; a draft model
        counts as a ModelDrafter); ``NotReplayable`` for a drafter that declares none."""
        if isinstance(drafter, ReplayDrafter):
            return drafter
        kind = MODEL if isinstance(drafter, torch.nn.Module) else declared(drafter, "replay_as")
        if kind == MODEL:
            return cls(MODEL)
        if kind == HYBRID:
            return cls(HYBRID, drafter.lookup.max_ngram, drafter.lookup.min_ngram, drafter.min_match)
        if kind == LOOKUP:
            return cls(LOOKUP, drafter.max_ngram, drafter.min_ngram)
        raise NotReplayable(f"drafter of type {type(drafter).__name__} cannot be replayed (its class declares no "
                            f"replay_as, or {kind!r}: use {MODEL!r}, {LOOKUP!r} or {HYBRID!r}): run the loop for it")


class NotReplayable(ValueError):
    """A drafter whose proposals the replay cannot reproduce (its class declares no ``replay_as``)."""


def replayable(drafter: object) -> bool:
    """Whether the greedy replay reproduces this drafter's (a class's or an instance's) proposals."""
    return isinstance(drafter, (ReplayDrafter, torch.nn.Module)) or declared(drafter, "replay_as") in (MODEL, LOOKUP,
                                                                                                      HYBRID)


@dataclass(frozen=True)
class ReplayStep:
    """One replayed iteration, in the loop's terms (``speclab.decoding.step.Step`` for one row)."""

    length: int  # tokens before the iteration, prompt included
    k: int  # the policy's choice, after the cap
    proposed: int
    accepted: int
    new_tokens: int  # after EOS and the token budget
    label: Hashable  # the drafter's label for this iteration (None: the draft model has none)
    source: str  # who proposed: "model", "lookup", or "" (no proposal: a plain step)
    draft_fed: int  # tokens in the draft model's first call (0: it did not run)
    draft_calls: int
    done: bool
    complete: bool = True  # False: a judged proposal lay past the known target tokens (taken as rejected)


@dataclass
class Replay:
    prompt_len: int
    uses_model: bool
    uses_lookup: bool
    merged: bool = True  # the replayed loop's prompt rode in its first iteration (``merge_prefill``)
    steps: list[ReplayStep] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the output (the target's greedy tokens, EOS applied)

    @property
    def proposed(self) -> int:
        return sum(s.proposed for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float:
        """accepted / checked proposals, as ``speclab.decoding.loop.GenerationResult.acceptance_rate``."""
        checked = sum(int(checked_proposals(s.accepted, s.proposed)) for s in self.steps)
        return self.accepted / checked if checked else float("nan")

    @property
    def tokens_per_target_pass(self) -> float:
        return len(self.tokens) / len(self.steps) if self.steps else float("nan")

    @property
    def complete(self) -> bool:
        return all(s.complete for s in self.steps)

    def trace(self) -> Trace:
        """The time model's view of the run (as ``speclab.costs.planning.traces`` builds it from acceptance rows)."""
        col = lambda name: np.array([getattr(s, name) for s in self.steps], dtype=int)  # noqa: E731
        return Trace(self.prompt_len, col("proposed"), col("new_tokens"), col("length"), col("draft_fed"),
                     col("draft_calls"), self.uses_model, self.uses_lookup, self.merged)


def draft_seen_at_start(prompt_len: int, merge_prefill: bool = True) -> int:
    """Prompt tokens the draft model holds in its cache before the first iteration: none with a merged
    prefill (its first call runs the whole prompt), all but the last one when prefilled apart."""
    return 0 if merge_prefill else prompt_len - 1


def proposal_cap(max_new_tokens: int, generated: int) -> int:
    """The most proposals an iteration may make: the target's own token is always one more."""
    return max_new_tokens - generated - 1


def finish(tokens: Sequence[int], length: int, limit: int, eos: set[int]) -> tuple[int, bool]:
    """The length after an iteration that produced ``tokens`` (accepted proposals, then the target's
    own) and whether the row is done: ``speclab.decoding.step.finish_rule`` for one row."""
    for i, t in enumerate(tokens):
        if t in eos:
            return min(length + i + 1, limit), True
    final = min(length + len(tokens), limit)
    return final, final >= limit


def _matching(proposals: Sequence[int], count: int, truth: Sequence[int], start: int) -> tuple[int, bool]:
    """Consecutive j < count with proposals[j] == truth[start + j]; False when that run reached past the
    known tokens (the position is taken as a rejection: the loop's verdict there is unknown)."""
    for j in range(count):
        if start + j >= len(truth) or j >= len(proposals):
            return j, False
        if proposals[j] != truth[start + j]:
            return j, True
    return count, True


def replay(prompt: Sequence[int], target: Sequence[int], draft: Sequence[int] | None, drafter: object,
           k: int | KPolicy, max_new_tokens: int, eos_token_id: int | list[int] | None = None,
           merge_prefill: bool = True) -> Replay:
    """The greedy loop's iterations on one prompt, from the target's greedy tokens alone.

    ``target``: the target's greedy tokens after the prompt, up to its EOS or ``max_new_tokens`` (and
    best a few past an EOS: the last iteration may propose beyond it, see ``replay_reference``);
    ``draft``: the draft's greedy choice for each of those tokens given the text before it (None for
    prompt lookup); ``drafter``: a ``ReplayDrafter`` or a loop drafter / draft model to describe;
    ``k``: a fixed k or a k policy (started here, as the loop starts it); ``merge_prefill``: as the
    loop's (it decides only the draft's catch-up counts, never what is accepted).
    """
    spec = ReplayDrafter.of(drafter)
    target = [int(t) for t in target]
    draft = None if draft is None else [int(t) for t in draft]
    if spec.uses_model and (draft is None or len(draft) < len(target)):
        raise ValueError(f"a {spec.kind} drafter's replay needs the draft's choice at each of the target's "
                         f"{len(target)} tokens; got {None if draft is None else len(draft)}")
    max_new = check_budget(max_new_tokens)
    eos = set(eos_ids(eos_token_id))
    plen = len(prompt)
    text = torch.tensor([int(t) for t in prompt] + target, dtype=torch.long)
    policies = RowPolicies(k, 1)
    out = Replay(plen, spec.uses_model, spec.uses_lookup, merge_prefill)
    seen, length, limit = draft_seen_at_start(plen, merge_prefill), plen, plen + max_new
    while True:
        g = length - plen
        label: Hashable = None
        n, start = 0, -1
        if spec.uses_lookup:
            n, start = lookup_match(text[:length], spec.max_ngram, spec.min_ngram)
            label = n if spec.kind == LOOKUP else (n if n and length - start >= spec.min_match else HybridDrafter.MODEL)
        ks = policies.ks([label] if policies.conditioned and spec.uses_lookup else None)
        kk = min(ks[0], proposal_cap(max_new, g))
        # The lookup's copy of the text so far (never past ``length``), as PromptLookupDrafter.proposals.
        found = continuation(text[:length], n, start, kk).tolist() if spec.uses_lookup and kk else None
        if spec.kind == LOOKUP or (spec.kind == HYBRID and found is not None and len(found) >= min(spec.min_match, kk)):
            source, proposals = ("lookup" if found else ""), found or []
        else:
            # A greedy draft proposes the target's token wherever its choice there equals it, so its
            # proposals match the target up to the first position where its choice does not.
            source, proposals = ("model" if kk else ""), draft[g: g + kk]
        count = kk if source == "model" else len(proposals)
        accepted, complete = _matching(proposals, count, target, g)
        made = target[g: g + accepted + 1]  # accepted proposals, then the target's own token
        if len(made) < accepted + 1 and not eos.intersection(made):
            raise ValueError(f"the target's {len(target)} greedy tokens end before EOS or max_new_tokens={max_new}: "
                             "pass its whole greedy output")
        final, done = finish(made, length, limit, eos)
        if final <= length or accepted < 0:  # every loop iteration adds a token: never spin on a broken rule
            raise RuntimeError(f"replay stalled at length {length} (k={kk}, accepted={accepted}, final={final})")
        fed = calls = 0
        if source == "model":
            # ModelDrafter: the first call feeds what the draft has not seen; its last proposal is never
            # fed back, and a rollback keeps what was accepted.
            fed, calls = length - seen, count
            seen = min(length + count - 1, length + accepted)
        policies.update([count], [accepted])
        out.steps.append(ReplayStep(length, kk, count, accepted, final - length, label, source, fed, calls, done,
                                    complete))
        if done:
            out.tokens = target[: final - plen]
            return out
        length += accepted + 1
