"""Drafters propose tokens for the target to verify. The loop only sees this interface."""
from __future__ import annotations

from typing import Protocol

import torch

from speclab.cache import crop_to, forward_logits, new_cache
from speclab.sampling import SamplingConfig, logits_to_probs


class Drafter(Protocol):
    """Optionally also ``label(ids, length)``: what the next proposal will rest on, before it is made
    (``PromptLookupDrafter``: the matched n-gram's length); a policy with ``condition`` then gets it."""

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        """Begin a sequence; ``ids[0, :n_ctx]`` may be pre-processed (prefill)."""

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k proposals continuing ``ids[0, :length]``, and their distributions (sampling) or None."""

    def rollback(self, valid_length: int) -> None:
        """Only ``ids[0, :valid_length]`` is still part of the output."""


class ModelDrafter:
    """A draft language model with its own KV cache.

    ``last_fed`` / ``last_calls``: tokens in the first forward call of the last ``propose`` (the
    catch-up: 1 after a rejection, 2 after an all-accepted iteration, more after lookup iterations
    of a hybrid) and the number of forward calls. A time model needs both: the first call of an
    iteration is a multi-token pass, not a step.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = new_cache(model)
        self.seen = 0  # positions of ids already in self.cache
        self.last_fed = self.last_calls = 0

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self.cache = new_cache(self.model)
        self.seen = 0
        if n_ctx > 0:
            forward_logits(self.model, ids[:, :n_ctx], self.cache, 1)
            self.seen = n_ctx

    @torch.inference_mode()
    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Feed whatever the draft has not seen yet: after an all-accepted iteration that is
        # its own last proposal plus the target's bonus token.
        inp = ids[:, self.seen:length]
        self.last_fed, self.last_calls = (inp.shape[1], k) if k else (0, 0)
        proposals, dists = [], []
        for _ in range(k):
            logits = forward_logits(self.model, inp, self.cache, 1)[-1]
            if sampling.do_sample:
                q = logits_to_probs(logits, sampling)
                x = torch.multinomial(q, 1, generator=generator)
                dists.append(q)
            else:
                x = torch.argmax(logits, dim=-1, keepdim=True)
            proposals.append(x)
            inp = x.view(1, 1)
        # The last proposal was never fed back in.
        self.seen = length + k - 1 if k else self.seen
        props = torch.cat(proposals) if proposals else ids.new_empty(0)
        return props, (torch.stack(dists) if dists else None)

    def rollback(self, valid_length: int) -> None:
        keep = min(self.seen, valid_length)
        crop_to(self.cache, keep)
        self.seen = keep


class PromptLookupDrafter:
    """Proposes the tokens that followed the most recent earlier occurrence of the current n-gram.

    The n-gram is the last n tokens of the text so far (prompt and generated), longest n first
    (``max_ngram`` down to ``min_ngram``). No match: no proposal, and the iteration is a plain step.
    No model and no cache: proposals are deterministic (their distribution is a point mass).

    ``label`` names the evidence behind the next proposal before it is made: the length n of the
    matched n-gram (0: no match). A longer match is much likelier to be continued (a copied span,
    not a common token), so a k policy can price each n on its own (``speclab.k_policy.ConditionedK``).
    """

    last_fed = last_calls = 0  # no model runs

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes min={min_ngram}, max={max_ngram} are not allowed: need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._match: tuple[int, int, int] | None = None  # (length, n, start) found by label(), for propose()

    def match(self, ids: torch.Tensor, length: int, keep: bool = False) -> tuple[int, int]:
        """(n, start) of the match for ``ids[0, :length]``. ``keep``: remember it for the next call
        at this length (label() then propose() in one iteration search once); any other call uses it up."""
        found = self._match[1:] if self._match is not None and self._match[0] == length else None
        if found is None:
            found = lookup_match(ids[0, :length], self.max_ngram, self.min_ngram)
        self._match = (length, *found) if keep else None
        return found

    def label(self, ids: torch.Tensor, length: int) -> int:
        return self.match(ids, length, keep=True)[0]

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self._match = None

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return continuation(ids[0, :length], *self.match(ids, length), k), None

    def rollback(self, valid_length: int) -> None:
        self._match = None  # the text changed: the next iteration looks again


def lookup_match(seq: torch.Tensor, max_ngram: int = 3, min_ngram: int = 1) -> tuple[int, int]:
    """(n, start): the longest final n-gram of seq (max_ngram down to min_ngram) with an earlier
    occurrence, and where the tokens after its latest occurrence begin; (0, -1) when none has one."""
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = seq[length - n:]
        # Windows starting at 0 .. length-n-1: every occurrence that ends before the final n-gram itself.
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = torch.nonzero((windows == pattern).all(dim=1)).flatten()
        if hits.numel():
            return n, int(hits[-1]) + n  # the most recent occurrence
    return 0, -1


def continuation(seq: torch.Tensor, n: int, start: int, k: int) -> torch.Tensor:
    """Up to k tokens of seq from ``start``, for a match of length n (``lookup_match``); empty when n = 0."""
    return seq[start: start + k] if n else seq.new_empty(0)


def lookup_continuation(seq: torch.Tensor, k: int, max_ngram: int = 3, min_ngram: int = 1) -> torch.Tensor:
    """Up to k tokens that followed the latest earlier match of seq's final n-gram (empty when none)."""
    return continuation(seq, *lookup_match(seq, max_ngram, min_ngram), k)


class HybridDrafter:
    """Prompt lookup when the current n-gram has an earlier match (free proposals), the draft model otherwise.

    The draft model's cache catches up lazily: while lookup proposes, the model sees nothing; the next
    time it drafts, it first runs every token it has not seen in one pass (``ModelDrafter`` feeds
    ``ids[seen:length]``), so no model step is spent on text that lookup already covered. Exactness
    needs nothing special: lookup proposals are point masses (the loop builds q for them), and the
    target's check and rollback are the same whichever drafter proposed.

    ``label``: the matched n-gram's length when lookup will propose, ``"model"`` when the draft model
    will (with ``min_match`` > 1 and k < min_match a short match can still be used: the label then
    says "model" for an iteration lookup proposes).
    """

    MODEL = "model"

    def __init__(self, model: torch.nn.Module, max_ngram: int = 3, min_ngram: int = 1, min_match: int = 1) -> None:
        if min_match < 1:
            raise ValueError(f"min_match={min_match} is not allowed: use an integer >= 1")
        self.lookup = PromptLookupDrafter(max_ngram, min_ngram)
        self.model = ModelDrafter(model)
        self.min_match = min_match
        self.lookup_iterations = self.model_iterations = 0
        self.last_fed = self.last_calls = 0

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self.model.start(ids, n_ctx)
        self.lookup.start(ids, n_ctx)
        self.lookup_iterations = self.model_iterations = 0

    def label(self, ids: torch.Tensor, length: int) -> int | str:
        n, start = self.lookup.match(ids, length, keep=True)
        return n if n and length - start >= self.min_match else self.MODEL

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        found, _ = self.lookup.propose(ids, length, k, sampling, generator)
        if found.numel() >= min(self.min_match, k):
            self.lookup_iterations += 1
            self.last_fed = self.last_calls = 0
            return found, None
        self.model_iterations += 1
        out = self.model.propose(ids, length, k, sampling, generator)
        self.last_fed, self.last_calls = self.model.last_fed, self.model.last_calls
        return out

    def rollback(self, valid_length: int) -> None:
        self.model.rollback(valid_length)
        self.lookup.rollback(valid_length)
