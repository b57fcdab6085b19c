"""Batched decoding over B prompts of different lengths: a plain baseline and speculative decoding.

The speculative step is ``speclab.decoding.step``'s, the same one ``speculative_generate`` runs on one row;
this module turns its per-row records into batch statistics. Any drafter runs batched (the draft
model, prompt lookup, the hybrid) with a fixed k or a k policy per row.

Exact by construction: every row of ``batch_speculative_generate`` (greedy) equals that prompt's
batch-1 ``plain_greedy`` output, and sampled rows keep the target's distribution, because each
row sees exactly the keys, values and position ids it would see alone.

Design: one physical layout, per-row logical positions, masks instead of moves
----------------------------------------------------------------------------
Rows accept different numbers of proposals (the ragged problem). After one iteration row a may
keep 4 of its proposals and row b none; batched loops commonly lose exactness there, by
letting position ids follow the physical column, by cropping one cache length for all rows, or by
un-masking a rejected slot. Here (``speclab.decoding.batch_cache.RaggedKV``):

- **Cache**: both models keep one ``DynamicCache`` in which every row has the same physical
  width. A row's rejected proposals *stay* in the cache but are masked out in that row's
  attention mask; only the suffix of columns that *no* row kept is cropped (``crop``). At batch 1
  that suffix is every rejected slot, so B = 1 runs without a mask (it *is* the batch-1 loop).
- **Positions**: each column remembers the logical position of its token; new tokens get position
  ids continuing from their own row's logical length, never from the physical width. Causality is
  physical (HF's causal mask), which is right because valid columns stay in logical order.
- **Inputs**: a model is fed, per row, the tokens it has not run yet, right-aligned in a shared
  width; rows with fewer get masked dummy slots on the left. The target has one (the last
  accepted token) plus the row's proposals, which may number fewer than the widest row's (a
  policy per row, lookup matches of different lengths, a hybrid's lookup rows); the draft has
  one, or two after an all-accepted iteration (its last proposal and the bonus token), or more
  after iterations it sat out; a row that has made its proposals feeds dummies while others go on.
- **Holes** accumulate (columns masked in some rows, kept in others). They cost attention work,
  reported as ``masked_share``; when the excess over a hole-free left-padded layout passes
  ``compact_at`` of the longest row, ``compact`` re-packs valid columns with one gather per layer.
- **Finished rows** (EOS or token budget) leave the batch at the end of the iteration: per-layer
  slicing of keys and values (``DynamicCache.batch_select_indices``), then the leading columns no
  remaining row uses are dropped. Later passes run only the unfinished rows.

Why not realign (shift rows so all have the same length) after every iteration: that moves the
whole cache every iteration; masks cost a [B, P] boolean per pass, and a re-pack is done only
when holes pile up. The time for masks/positions (``mask_s``), per-row rollback (``rollback_s``)
and row drops/compaction (``realign_s``) is measured per iteration with device synchronisation
(``layout_s`` is their sum). Not in it: the 4-D mask HF builds from the 2-D one inside each
forward pass (``generate()`` pays the same), which is part of ``draft_s`` / ``verify_s``.

Limits: models with sliding-window layers are exact only while the layout is dense (one row, or
rows that never diverge) or the physical width stays within the window (checked; HF's window
counts physical columns), and their caches are never re-packed.

Acceptance is per row: greedy is ``accept_greedy`` vectorised over rows and proposals
(``batch_accept_greedy``); sampling applies the batch-1 rule functions of
``speclab.decoding.acceptance`` (the correct one or a deliberately wrong one) to each row's proposals and
distributions, the distributions having been computed for all rows at once.
Same concept, other floors: ``analysis/batch.py``, ``pipeline/stages/batch.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.decoding.acceptance import AcceptRule, accept_sample, batch_accept_greedy  # noqa: F401 - re-exported
from speclab.decoding.batch_cache import RaggedKV
from speclab.decoding.drafters import Drafter
from speclab.decoding.k_policy import KPolicy
from speclab.decoding.checks import check_call
from speclab.decoding.rows import Rows, eos_tensor
from speclab.decoding.sampling import GREEDY, SamplingConfig, logits_to_probs
from speclab.decoding.step import run_speculative
from speclab.decoding.timing import Stopwatch, synchronize


@dataclass
class BatchIterationStats:
    """One batched pass (plain: a decode step, k = 0) or draft-verify-rollback iteration."""

    rows: int  # rows in the batch during this iteration (finished rows have left)
    k: int  # proposals per row (the widest row's, when rows propose different numbers)
    accepted: int  # summed over rows
    checked: int  # proposals the target judged, summed over rows
    bonus_rows: int  # rows that accepted all k proposals
    new_tokens: int  # tokens appended to outputs, summed over rows (after EOS / budget truncation)
    draft_s: float
    verify_s: float
    rollback_s: float
    realign_s: float  # dropping finished rows and compaction
    mask_s: float  # building inputs, masks and position ids (part of draft_s and verify_s)
    total_s: float
    masked_share: float  # masked (padding, holes) share of the target's key/value slots at the verify pass
    draft_masked_share: float  # the same for the draft's cache at its last step
    dummy_inputs: int  # masked dummy input slots fed this iteration (wasted token work)
    with_prompt: bool = False  # the iteration's passes also processed the prompts (a merged prefill)

    @property
    def bookkeeping_s(self) -> float:
        """Everything outside draft, verify, rollback and realignment (outputs, EOS checks, stats)."""
        return self.total_s - self.draft_s - self.verify_s - self.rollback_s - self.realign_s

    @property
    def layout_s(self) -> float:
        """Time spent keeping the ragged layout right: masks and positions, per-row rollback, realignment."""
        return self.mask_s + self.rollback_s + self.realign_s


@dataclass
class BatchResult:
    tokens: list[list[int]]  # new tokens of each row, in prompt order
    prompt_lens: list[int]
    wall_s: float  # prefill included
    prefill_s: float
    accepted: list[int]  # per row (speculative; zeros for plain)
    proposed: list[int]
    checked: list[int]
    iterations: list[BatchIterationStats] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        """Throughput summed over rows."""
        return self.total_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Pooled alpha-hat: accepted / checked proposals over all rows."""
        c = sum(self.checked)
        return sum(self.accepted) / c if c else float("nan")

    @property
    def row_acceptance_rates(self) -> list[float]:
        return [a / c if c else float("nan") for a, c in zip(self.accepted, self.checked)]

    @property
    def layout_share(self) -> float:
        """Share of iteration time spent on masks, positions, rollback and realignment."""
        total = sum(it.total_s for it in self.iterations)
        return sum(it.layout_s for it in self.iterations) / total if total > 0 else float("nan")


def _rows(prompts: list[torch.Tensor]) -> list[torch.Tensor]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token id tensors")
    rows = []
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"prompt {i} of type {type(p).__name__} is not allowed: use a tensor of token ids")
        if p.dim() == 2 and p.shape[0] == 1:
            p = p[0]
        if p.dim() != 1 or p.shape[0] < 1:
            raise ValueError(f"prompt {i} must have shape [n>=1] or [1, n>=1]; got {tuple(p.shape)}")
        rows.append(p)
    if len({p.device for p in rows}) > 1:
        raise ValueError("all prompts must be on the same device")
    return rows


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of logits [B, V]."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    return torch.multinomial(logits_to_probs(logits, sampling), 1, generator=generator).squeeze(1)


@torch.inference_mode()
def batch_plain_generate(model: torch.nn.Module, prompts: list[torch.Tensor], max_new_tokens: int,
                         sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                         generator: torch.Generator | None = None) -> BatchResult:
    """One target pass per token for all unfinished rows (left padding, mask, explicit positions)."""
    rows = _rows(prompts)
    checked = check_call(model, [], rows, max_new_tokens, eos_token_id)
    max_new_tokens, device = checked.max_new_tokens, rows[0].device
    eos = eos_tensor(checked.eos, device)
    st = Rows(rows, max_new_tokens + 1)
    kv = RaggedKV(model, len(rows), device)
    longest = max(st.plen_h)

    synchronize(device)
    t0 = time.perf_counter()
    logits = kv.feed(st.seq, st.plen, longest, len(set(st.plen_h)) == 1, 1)[:, -1]
    tok = _choose(logits, sampling, generator)
    synchronize(device)
    prefill_s = time.perf_counter() - t0
    iterations: list[BatchIterationStats] = []
    generated = 0
    # Masked slots change only when rows leave (each pass adds one valid column per row): a host count.
    masked = int(kv.masked_slots())
    while True:
        # One iteration: store the last pass's tokens, let finished rows go, run the next pass.
        t_iter = time.perf_counter()
        rows_now = st.active
        a_sw, v_sw = Stopwatch(device), Stopwatch(device)
        st.seq.scatter_(1, st.length[:, None], tok[:, None])
        st.length = st.length + 1
        generated += 1
        # Every row gains one token per pass, so the budget is the same for all rows and known here.
        if generated >= max_new_tokens:
            done = [True] * rows_now
        elif eos.numel() and bool((hit := torch.isin(tok, eos)).any()):
            done = hit.tolist()
        else:
            done = None
        if done is not None:
            with a_sw:
                keep = st.finish(done, st.length.tolist())
                if st.active:
                    kv.select(keep[0])
                    masked = int(kv.masked_slots())
        if not st.active:
            break
        m0 = kv.layout.seconds
        with v_sw:
            logits = kv.feed(st.seq, st.length, 1, True, 1)[:, -1]
            tok = _choose(logits, sampling, generator)
        iterations.append(BatchIterationStats(
            rows=st.active, k=0, accepted=0, checked=0, bonus_rows=0, new_tokens=st.active, draft_s=0.0,
            verify_s=v_sw.seconds, rollback_s=0.0, realign_s=a_sw.seconds, mask_s=kv.layout.seconds - m0,
            total_s=time.perf_counter() - t_iter, masked_share=masked / (st.active * kv.width),
            draft_masked_share=float("nan"), dummy_inputs=0))
    synchronize(device)
    wall = time.perf_counter() - t0
    zeros = [0] * len(rows)
    return BatchResult(st.outputs, [p.shape[0] for p in rows], wall, prefill_s, zeros, list(zeros), list(zeros),
                       iterations)


@torch.inference_mode()
def batch_speculative_generate(target: torch.nn.Module, draft_model: torch.nn.Module | Drafter,
                               prompts: list[torch.Tensor], max_new_tokens: int, k: int | KPolicy = 4,
                               sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                               generator: torch.Generator | None = None, rule: AcceptRule = accept_sample,
                               compact_at: float | None = 0.25, merge_prefill: bool = True) -> BatchResult:
    """Draft up to k tokens per row, verify all rows in one target pass, keep each row's accepted prefix.

    ``draft_model``: a draft model (a ``ModelDrafter``) or a row drafter (``ModelDrafter``,
    ``PromptLookupDrafter``, ``HybridDrafter``). ``k``: a fixed number of proposals or a k policy;
    each row runs its own copy of the policy (its own k and, with ``ConditionedK``, its own labels).
    ``rule`` is the sampling acceptance rule applied to each row (the wrong ones exist for tests);
    greedy uses ``accept_greedy`` semantics. ``compact_at``: re-pack a cache when its columns exceed
    a hole-free layout by this share of the longest row (None: never). ``merge_prefill``: the prompts
    ride in the first iteration's passes (``prefill_s`` then holds only the drafter's start); False:
    prefilled apart first.
    """
    rows = _rows(prompts)
    run = run_speculative(target, draft_model, rows, max_new_tokens, k, sampling, eos_token_id, generator, rule,
                          compact_at, merge_prefill)
    acc, prop, chk = ([0] * len(rows) for _ in range(3))
    for s, ids in zip(run.steps, run.row_ids):
        for i, c, a in zip(ids, s.counts, s.accepted):
            acc[i], prop[i], chk[i] = acc[i] + a, prop[i] + c, chk[i] + min(a + 1, c)
    iterations = [BatchIterationStats(
        rows=len(s.counts), k=max(s.counts), accepted=sum(s.accepted),
        checked=sum(min(a + 1, c) for a, c in zip(s.accepted, s.counts)),
        bonus_rows=sum(1 for a, c in zip(s.accepted, s.counts) if 0 < c == a),
        new_tokens=sum(f - n for f, n in zip(s.final, s.lengths)), draft_s=s.draft_s, verify_s=s.verify_s,
        rollback_s=s.rollback_s, realign_s=s.realign_s, mask_s=s.mask_s, total_s=s.total_s,
        masked_share=s.masked_share, draft_masked_share=s.draft_masked_share, dummy_inputs=s.dummy_inputs,
        with_prompt=s.with_prompt,
    ) for s in run.steps]
    return BatchResult(run.tokens, [p.shape[0] for p in rows], run.wall_s, run.prefill_s, acc, prop, chk, iterations)
