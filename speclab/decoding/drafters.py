"""Drafters propose tokens for the target to verify, for every row of a batch (one row at batch 1)."""
from __future__ import annotations

from typing import Any, Hashable, Protocol

import torch

from speclab.decoding.batch_cache import RaggedKV
from speclab.decoding.checks import shown
from speclab.decoding.sampling import SamplingConfig, logits_to_probs


class OneRowDrafter(Protocol):
    """A one-row drafter, for ``speculative_generate`` only (wrapped in ``OneRow``). Optionally also
    ``label(ids, length)``: what the next proposal will rest on, before it is made; a policy with
    ``condition`` then gets it."""

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        """Begin a sequence; ``ids[0, :n_ctx]`` may be pre-processed (prefill)."""

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k proposals continuing ``ids[0, :length]``, and their distributions (sampling) or None."""

    def rollback(self, valid_length: int) -> None:
        """Only ``ids[0, :valid_length]`` is still part of the output."""


class Drafter(Protocol):
    """A drafter over the rows of a batch (one row at batch 1); what ``speclab.decoding.step`` drives.

    ``seq`` [B, L] holds each row's tokens left-aligned (column = logical position); lengths come as a
    device tensor and its host copy. ``labelled``: ``label_rows`` names what each row's next proposal
    will rest on (``PromptLookupDrafter``: the matched n-gram's length), for a policy with ``condition``.
    ``last_fed`` / ``last_calls`` / ``last_dummies``: the draft model's first-call width, its number of
    forward calls and the masked dummy slots it ran in the last ``propose_rows`` (0 without a model).

    What the pipeline asks of a drafter class, each with a default a new class may keep (``declared``): whether it
    runs the pair's draft model (its constructor takes a ``model``: it gets the pair's draft model and pays for its
    proposals; ``speclab.drafting.strategy.drafts_with_model``), ``looks_up`` (it searches the text for n-grams every
    iteration, a cost the time model charges; default False) and ``replay_as`` (how the greedy replay,
    ``speclab.drafting.replay``, reproduces its proposals: ``"model"``, ``"prompt_lookup"`` (read from its
    ``max_ngram``, ``min_ngram``) or ``"hybrid"`` (its ``lookup`` and ``min_match``), only where its proposals are
    those; default None: the replay cannot, and the acceptance stage runs the loop for it instead).
    """

    labelled: bool = False
    last_fed: int = 0
    last_calls: int = 0
    last_dummies: int = 0
    looks_up: bool = False
    replay_as: str | None = None

    def start_rows(self, seq: torch.Tensor, n_ctx: torch.Tensor, n_ctx_h: list[int]) -> None:
        """Begin; row b's ``seq[b, :n_ctx[b]]`` may be pre-processed (prefill)."""

    def label_rows(self, seq: torch.Tensor, length_h: list[int]) -> list[Hashable]:
        """Each row's label for its coming proposals."""

    def propose_rows(self, seq: torch.Tensor, length: torch.Tensor, length_h: list[int], ks: list[int],
                     sampling: SamplingConfig, generator: torch.Generator | None
                     ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        """Up to ks[b] proposals for row b, written into ``seq[b, length_b:]``: their counts, and each
        row's distributions [count, V] (sampling; None where proposals are deterministic)."""

    def rollback_rows(self, valid_length: torch.Tensor, accepted_h: list[int]) -> None:
        """Row b keeps ``seq[b, :valid_length_b]`` (its old length plus ``accepted_h[b]`` proposals)."""

    def select_rows(self, rows: torch.Tensor, rows_h: list[int]) -> None:
        """Only these rows stay (finished rows leave the batch)."""

    def caches(self) -> list[RaggedKV]:
        """The KV caches it keeps (for row selection and compaction)."""


class ModelDrafter:
    """A draft language model with its own KV cache over the rows (``RaggedKV``).

    Each row feeds whatever the draft has not run yet: after a rejection its last accepted token,
    after an all-accepted iteration its own last proposal plus the target's bonus token, more after
    lookup iterations of a hybrid or plain steps. ``last_fed`` (the widest such catch-up, the first
    forward call's width) and ``last_calls`` matter to a time model: the first call of an iteration
    is a multi-token pass, not a step. Rows with fewer proposals than the widest feed masked dummies.
    """

    labelled = False
    looks_up = False
    replay_as = "model"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.kv: RaggedKV | None = None
        self.seen: list[int] = []  # host copy of self.kv.seen
        self.last_fed = self.last_calls = self.last_dummies = 0
        self._ks: list[int] = []  # the last propose_rows' counts, until its rollback
        self._length_h: list[int] = []

    def start_rows(self, seq: torch.Tensor, n_ctx: torch.Tensor, n_ctx_h: list[int]) -> None:
        self.kv = RaggedKV(self.model, seq.shape[0], seq.device)
        if max(n_ctx_h):
            self.kv.feed(seq, n_ctx, max(n_ctx_h), len(set(n_ctx_h)) == 1, 1)
        self.seen, self._ks = list(n_ctx_h), []

    @torch.inference_mode()
    def propose_rows(self, seq: torch.Tensor, length: torch.Tensor, length_h: list[int], ks: list[int],
                     sampling: SamplingConfig, generator: torch.Generator | None
                     ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        kmax = max(ks)
        self._ks, self._length_h = list(ks), length_h
        self.last_fed = self.last_calls = self.last_dummies = 0
        if not kmax:
            return list(ks), None
        pending = [n - s for n, s in zip(length_h, self.seen)]
        m0 = max(p for p, k in zip(pending, ks) if k)
        same = min(ks) == kmax
        k_rows = None if same else torch.tensor(ks, device=seq.device)
        qs = []
        for i in range(kmax):
            upto = length + i
            if k_rows is not None:  # a row that has made its proposals feeds nothing new: a masked dummy
                upto = torch.where(k_rows > i, upto, self.kv.seen)
            m = m0 if i == 0 else 1
            logits = self.kv.feed(seq, upto, m, same and (i > 0 or min(pending) == m0), 1)[:, -1]
            if sampling.do_sample:
                q = logits_to_probs(logits, sampling)
                if k_rows is None:
                    x = torch.multinomial(q, 1, generator=generator)
                else:  # a finished row's dummy query may see no valid column at all: never sampled
                    rows = [b for b, k in enumerate(ks) if k > i]
                    x = seq.new_zeros((seq.shape[0], 1))
                    x[rows] = torch.multinomial(q[rows], 1, generator=generator)
                qs.append(q)
            else:
                x = logits.argmax(dim=-1, keepdim=True)
            # Past a row's own proposals this writes scratch, never read as a token.
            seq.scatter_(1, (length + i)[:, None], x)
        # The last proposal was never fed back in.
        self.seen = [n + k - 1 if k else s for n, k, s in zip(length_h, ks, self.seen)]
        self.last_fed, self.last_calls = m0, kmax
        self.last_dummies = sum((m0 - p if k else m0) + kmax - max(k, 1) for p, k in zip(pending, ks))
        q_all = torch.stack(qs, dim=1) if qs else None
        return list(ks), (None if q_all is None else [q_all[b, :k] for b, k in enumerate(ks)])

    def rollback_rows(self, valid_length: torch.Tensor, accepted_h: list[int]) -> None:
        if not self._ks or not max(self._ks):
            return  # nothing ran since the last rollback
        # The draft ran its pending tokens, then proposals 1..k-1: row b keeps those up to its n_b.
        kept = [min(a, k - 1) for a, k in zip(accepted_h, self._ks) if k]
        self.kv.rollback(valid_length, max(self._ks) - 1 - max(kept), len(set(kept)) > 1)
        self.seen = [min(s, n + a) for s, n, a in zip(self.seen, self._length_h, accepted_h)]
        self._ks = []

    def select_rows(self, rows: torch.Tensor, rows_h: list[int]) -> None:
        self.kv.select(rows)
        self.seen = [self.seen[b] for b in rows_h]

    def caches(self) -> list[RaggedKV]:
        return [self.kv]


class OneRow:
    """A ``OneRowDrafter`` (start/propose/rollback) in the row interface, for batch 1."""

    last_dummies = 0

    def __init__(self, drafter: OneRowDrafter) -> None:
        self.drafter = drafter
        self.labelled = hasattr(drafter, "label")
        self._length = 0

    @property
    def last_fed(self) -> int:
        return getattr(self.drafter, "last_fed", 0)

    @property
    def last_calls(self) -> int:
        return getattr(self.drafter, "last_calls", 0)

    def start_rows(self, seq: torch.Tensor, n_ctx: torch.Tensor, n_ctx_h: list[int]) -> None:
        if seq.shape[0] != 1:
            raise ValueError(f"a one-row drafter ({type(self.drafter).__name__}) cannot draft for {seq.shape[0]} "
                             "rows: use ModelDrafter, PromptLookupDrafter or HybridDrafter")
        self.drafter.start(seq, n_ctx_h[0])

    def label_rows(self, seq: torch.Tensor, length_h: list[int]) -> list[Hashable]:
        return [self.drafter.label(seq, length_h[0])]

    def propose_rows(self, seq: torch.Tensor, length: torch.Tensor, length_h: list[int], ks: list[int],
                     sampling: SamplingConfig, generator: torch.Generator | None
                     ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        self._length = length_h[0]
        if not ks[0]:
            return [0], None
        props, q = self.drafter.propose(seq, self._length, ks[0], sampling, generator)
        seq[0, self._length: self._length + props.shape[0]] = props
        return [props.shape[0]], (None if q is None else [q])

    def rollback_rows(self, valid_length: torch.Tensor, accepted_h: list[int]) -> None:
        self.drafter.rollback(self._length + accepted_h[0])

    def select_rows(self, rows: torch.Tensor, rows_h: list[int]) -> None:
        pass  # one row: when it finishes, the run ends

    def caches(self) -> list[RaggedKV]:
        return []


def declared(drafter: object, name: str) -> Any:
    """What a drafter (a class or an instance) declares for the pipeline (``Drafter``: ``looks_up``, ``replay_as``),
    or the declaration's default where it says nothing."""
    return getattr(drafter, name, getattr(Drafter, name))


def row_drafter(drafter: object) -> Drafter:
    """A drafter in the row interface: a draft model becomes a ``ModelDrafter``, a one-row drafter a ``OneRow``."""
    if isinstance(drafter, torch.nn.Module):
        return ModelDrafter(drafter)
    if hasattr(drafter, "propose_rows"):
        return drafter
    if all(hasattr(drafter, m) for m in ("start", "propose", "rollback")):
        return OneRow(drafter)
    raise ValueError(f"drafter={shown(drafter)} is not allowed: give a draft model (torch.nn.Module) or a drafter "
                     "(ModelDrafter, PromptLookupDrafter, HybridDrafter, or one with start/propose/rollback)")


class PromptLookupDrafter:
    """Proposes the tokens that followed the most recent earlier occurrence of the current n-gram.

    The n-gram is the last n tokens of the text so far (prompt and generated), longest n first
    (``max_ngram`` down to ``min_ngram``). No match: no proposal, and the iteration is a plain step.
    No model and no cache: proposals are deterministic (their distribution is a point mass).

    ``label`` names the evidence behind the next proposal before it is made: the length n of the
    matched n-gram (0: no match). A longer match is much likelier to be continued (a copied span,
    not a common token), so a k policy can price each n on its own (``speclab.decoding.k_policy.ConditionedK``).
    """

    last_fed = last_calls = last_dummies = 0  # no model runs
    labelled = True
    looks_up = True
    replay_as = "prompt_lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes min={min_ngram}, max={max_ngram} are not allowed: need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # Per row: (length, n, start) found by label(), for propose().
        self._matches: list[tuple[int, int, int] | None] = [None]

    def match(self, ids: torch.Tensor, length: int, keep: bool = False, row: int = 0) -> tuple[int, int]:
        """(n, start) of the match for ``ids[row, :length]``. ``keep``: remember it for the next call
        at this length (label() then propose() in one iteration search once); any other call uses it up."""
        kept = self._matches[row]
        found = kept[1:] if kept is not None and kept[0] == length else None
        if found is None:
            found = lookup_match(ids[row, :length], self.max_ngram, self.min_ngram)
        self._matches[row] = (length, *found) if keep else None
        return found

    def label(self, ids: torch.Tensor, length: int) -> int:
        return self.match(ids, length, keep=True)[0]

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self._matches = [None]

    def propose(self, ids: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.proposals(ids, 0, length, k), None

    def proposals(self, seq: torch.Tensor, row: int, length: int, k: int) -> torch.Tensor:
        """Up to k proposals continuing ``seq[row, :length]`` (a view of it; empty without a match)."""
        return continuation(seq[row, :length], *self.match(seq, length, row=row), k)

    def rollback(self, valid_length: int) -> None:
        self._matches = [None] * len(self._matches)  # the text changed: the next iteration looks again

    def start_rows(self, seq: torch.Tensor, n_ctx: torch.Tensor, n_ctx_h: list[int]) -> None:
        self._matches = [None] * seq.shape[0]

    def label_rows(self, seq: torch.Tensor, length_h: list[int]) -> list[Hashable]:
        return [self.match(seq, n, keep=True, row=b)[0] for b, n in enumerate(length_h)]

    def propose_rows(self, seq: torch.Tensor, length: torch.Tensor, length_h: list[int], ks: list[int],
                     sampling: SamplingConfig, generator: torch.Generator | None
                     ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        counts = []
        for b, (n, k) in enumerate(zip(length_h, ks)):
            found = self.proposals(seq, b, n, k) if k else seq.new_empty(0)
            seq[b, n: n + found.shape[0]] = found
            counts.append(found.shape[0])
        return counts, None

    def rollback_rows(self, valid_length: torch.Tensor, accepted_h: list[int]) -> None:
        self.rollback(0)

    def select_rows(self, rows: torch.Tensor, rows_h: list[int]) -> None:
        self._matches = [self._matches[b] for b in rows_h]

    def caches(self) -> list[RaggedKV]:
        return []


def lookup_hits(seq: torch.Tensor, max_ngram: int = 3, min_ngram: int = 1) -> tuple[int, torch.Tensor]:
    """(n, starts): the longest final n-gram of seq (max_ngram down to min_ngram) with an earlier occurrence,
    and where each earlier occurrence starts (ascending); (0, empty) when none has one."""
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = seq[length - n:]
        # Windows starting at 0 .. length-n-1: every occurrence that ends before the final n-gram itself.
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = torch.nonzero((windows == pattern).all(dim=1)).flatten()
        if hits.numel():
            return n, hits
    return 0, seq.new_empty(0)


def lookup_match(seq: torch.Tensor, max_ngram: int = 3, min_ngram: int = 1) -> tuple[int, int]:
    """(n, start): the longest final n-gram of seq (max_ngram down to min_ngram) with an earlier
    occurrence, and where the tokens after its latest occurrence begin; (0, -1) when none has one."""
    n, hits = lookup_hits(seq, max_ngram, min_ngram)
    return (n, int(hits[-1]) + n) if n else (0, -1)  # the most recent occurrence


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
    labelled = True
    looks_up = True
    replay_as = "hybrid"

    def __init__(self, model: torch.nn.Module, max_ngram: int = 3, min_ngram: int = 1, min_match: int = 1) -> None:
        if min_match < 1:
            raise ValueError(f"min_match={min_match} is not allowed: use an integer >= 1")
        self.lookup = PromptLookupDrafter(max_ngram, min_ngram)
        self.model = ModelDrafter(model)
        self.min_match = min_match
        self.lookup_iterations = self.model_iterations = 0  # row-iterations each source proposed
        self.last_fed = self.last_calls = self.last_dummies = 0

    def label(self, ids: torch.Tensor, length: int, row: int = 0) -> int | str:
        n, start = self.lookup.match(ids, length, keep=True, row=row)
        return n if n and length - start >= self.min_match else self.MODEL

    def start_rows(self, seq: torch.Tensor, n_ctx: torch.Tensor, n_ctx_h: list[int]) -> None:
        self.model.start_rows(seq, n_ctx, n_ctx_h)
        self.lookup.start_rows(seq, n_ctx, n_ctx_h)
        self.lookup_iterations = self.model_iterations = 0

    def label_rows(self, seq: torch.Tensor, length_h: list[int]) -> list[Hashable]:
        return [self.label(seq, n, b) for b, n in enumerate(length_h)]

    def propose_rows(self, seq: torch.Tensor, length: torch.Tensor, length_h: list[int], ks: list[int],
                     sampling: SamplingConfig, generator: torch.Generator | None
                     ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        found = [self.lookup.proposals(seq, b, n, k) if k else None for b, (n, k) in enumerate(zip(length_h, ks))]
        by_lookup = [f is not None and f.shape[0] >= min(self.min_match, k) for f, k in zip(found, ks)]
        model_ks = [0 if u else k for u, k in zip(by_lookup, ks)]
        counts, q = self.model.propose_rows(seq, length, length_h, model_ks, sampling, generator)
        # The model wrote scratch past lookup rows' lengths; their proposals go in after it (views of
        # earlier columns, which no write touched).
        for b, f in enumerate(found):
            if by_lookup[b]:
                seq[b, length_h[b]: length_h[b] + f.shape[0]] = f
                counts[b] = f.shape[0]
                if q is not None:
                    q[b] = None
        self.lookup_iterations += sum(by_lookup)
        self.model_iterations += sum(1 for k in model_ks if k)
        self.last_fed, self.last_calls, self.last_dummies = (self.model.last_fed, self.model.last_calls,
                                                             self.model.last_dummies)
        return counts, q

    def rollback_rows(self, valid_length: torch.Tensor, accepted_h: list[int]) -> None:
        self.model.rollback_rows(valid_length, accepted_h)
        self.lookup.rollback_rows(valid_length, accepted_h)

    def select_rows(self, rows: torch.Tensor, rows_h: list[int]) -> None:
        self.model.select_rows(rows, rows_h)
        self.lookup.select_rows(rows, rows_h)

    def caches(self) -> list[RaggedKV]:
        return self.model.caches()
