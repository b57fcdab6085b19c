"""Drafters propose tokens for the target to verify. The loop only sees this interface."""
from __future__ import annotations

from typing import Protocol

import torch

from speclab.cache import crop_to, forward_logits, new_cache
from speclab.sampling import SamplingConfig, logits_to_probs


class Drafter(Protocol):
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
    """

    last_fed = last_calls = 0  # no model runs

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes min={min_ngram}, max={max_ngram} are not allowed: need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        pass

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return lookup_continuation(ids[0, :length], k, self.max_ngram, self.min_ngram), None

    def rollback(self, valid_length: int) -> None:
        pass


def lookup_continuation(seq: torch.Tensor, k: int, max_ngram: int = 3, min_ngram: int = 1) -> torch.Tensor:
    """Up to k tokens that followed the latest earlier match of seq's final n-gram (empty when none)."""
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = seq[length - n:]
        # Windows starting at 0 .. length-n-1: every occurrence that ends before the final n-gram itself.
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = torch.nonzero((windows == pattern).all(dim=1)).flatten()
        if hits.numel():
            start = int(hits[-1]) + n  # the most recent occurrence
            return seq[start: min(start + k, length)]
    return seq.new_empty(0)


class HybridDrafter:
    """Prompt lookup when the current n-gram has an earlier match (free proposals), the draft model otherwise.

    The draft model's cache catches up lazily: while lookup proposes, the model sees nothing; the next
    time it drafts, it first runs every token it has not seen in one pass (``ModelDrafter`` feeds
    ``ids[seen:length]``), so no model step is spent on text that lookup already covered. Exactness
    needs nothing special: lookup proposals are point masses (the loop builds q for them), and the
    target's check and rollback are the same whichever drafter proposed.
    """

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
        self.lookup_iterations = self.model_iterations = 0

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        found = lookup_continuation(ids[0, :length], k, self.lookup.max_ngram, self.lookup.min_ngram)
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
