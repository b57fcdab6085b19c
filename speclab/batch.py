"""Batched decoding over B prompts of different lengths: a plain baseline and speculative decoding.

Exact by construction: every row of ``batch_speculative_generate`` (greedy) equals that prompt's
batch-1 ``plain_greedy`` output, and sampled rows keep the target's distribution, because each
row sees exactly the keys, values and position ids it would see alone.

Design: one physical layout, per-row logical positions, masks instead of moves
----------------------------------------------------------------------------
Rows accept different numbers of proposals (the ragged problem). After one iteration row a may
keep 4 of its proposals and row b none; batched loops commonly lose exactness there, by
letting position ids follow the physical column, by cropping one cache length for all rows, or by
un-masking a rejected slot. Here (``speclab.batch_cache.RaggedKV``):

- **Cache**: both models keep one ``DynamicCache`` in which every row has the same physical
  width. A row's rejected proposals *stay* in the cache but are masked out in that row's
  attention mask; only the suffix of columns that *no* row kept is cropped (``crop``). At batch 1
  that suffix is every rejected slot, so B = 1 runs exactly like the batch-1 loop, without a mask.
- **Positions**: each column remembers the logical position of its token; new tokens get position
  ids continuing from their own row's logical length, never from the physical width. Causality is
  physical (HF's causal mask), which is right because valid columns stay in logical order.
- **Inputs**: a model is fed, per row, the tokens it has not run yet, right-aligned in a shared
  width; rows with fewer get masked dummy slots on the left. The target always has exactly one
  (the last accepted token) plus the k proposals; the draft has one, or two after an
  all-accepted iteration (its last proposal and the bonus token), like the batch-1 drafter.
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

Limits: models with sliding-window layers are exact only while the physical width stays within
the window (checked; HF's window counts physical columns), and their caches are never re-packed.

Acceptance is per row: greedy is ``accept_greedy`` vectorised over rows and proposals
(``batch_accept_greedy``); sampling applies the batch-1 rule functions of
``speclab.acceptance`` (the correct one or a deliberately wrong one) to each row's proposals and
distributions, the distributions having been computed for all rows at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.acceptance import AcceptRule, accept_sample
from speclab.batch_cache import RaggedKV
from speclab.sampling import GREEDY, SamplingConfig, logits_to_probs
from speclab.timing import Stopwatch, synchronize


@dataclass
class BatchIterationStats:
    """One batched pass (plain: a decode step, k = 0) or draft-verify-rollback iteration."""

    rows: int  # rows in the batch during this iteration (finished rows have left)
    k: int  # proposals per row
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


def batch_accept_greedy(proposals: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_greedy`` for every row: proposals [B, k], logits [B, k + 1, V] -> (n accepted [B], next token [B])."""
    best = target_logits.argmax(dim=-1)
    k = proposals.shape[1]
    n = torch.cumprod((best[:, :k] == proposals).to(torch.int64), dim=1).sum(dim=1)
    return n, best.gather(1, n[:, None]).squeeze(1)


def _rows(prompts: list[torch.Tensor]) -> list[torch.Tensor]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token id tensors")
    rows = []
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point:
            raise ValueError(f"prompt {i} must be an integer tensor of token ids")
        if p.dim() == 2 and p.shape[0] == 1:
            p = p[0]
        if p.dim() != 1 or p.shape[0] < 1:
            raise ValueError(f"prompt {i} must have shape [n>=1] or [1, n>=1]; got {tuple(p.shape)}")
        rows.append(p)
    if len({p.device for p in rows}) > 1:
        raise ValueError("all prompts must be on the same device")
    return rows


def _buffer(rows: list[torch.Tensor], extra: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token buffer [B, max_len + extra], each row left-aligned (column = logical position), and lengths."""
    lens = [p.shape[0] for p in rows]
    seq = torch.zeros((len(rows), max(lens) + extra), dtype=torch.long, device=rows[0].device)
    for b, p in enumerate(rows):
        seq[b, : lens[b]] = p
    return seq, torch.tensor(lens, device=seq.device)


def _eos_tensor(eos_token_id: int | list[int] | None, device: torch.device) -> torch.Tensor:
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


def _check_budget(max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of logits [B, V]."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    return torch.multinomial(logits_to_probs(logits, sampling), 1, generator=generator).squeeze(1)


class _Rows:
    """Per-row state of a batch in flight; finished rows are moved out into ``outputs``."""

    def __init__(self, rows: list[torch.Tensor], extra: int) -> None:
        self.seq, self.plen = _buffer(rows, extra)
        self.length = self.plen.clone()
        self.row_id = torch.arange(len(rows), device=self.seq.device)
        self.row_ids = list(range(len(rows)))  # host copy of row_id
        self.outputs: list[list[int] | None] = [None] * len(rows)
        self.plen_host = self.plen.tolist()

    @property
    def active(self) -> int:
        return len(self.row_ids)

    def finish(self, done: list[bool], final_len: list[int]) -> torch.Tensor | None:
        """Store finished rows' outputs; the batch positions that stay (None when none finished)."""
        if not any(done):
            return None
        for b, (d, n) in enumerate(zip(done, final_len)):
            if d:
                self.outputs[self.row_ids[b]] = self.seq[b, self.plen_host[b]: n].tolist()
        keep_host = [b for b, d in enumerate(done) if not d]
        keep = torch.tensor(keep_host, dtype=torch.long, device=self.seq.device)
        self.seq, self.plen, self.length, self.row_id = (
            self.seq[keep], self.plen[keep], self.length[keep], self.row_id[keep])
        self.row_ids = [self.row_ids[b] for b in keep_host]
        self.plen_host = [self.plen_host[b] for b in keep_host]
        return keep


@torch.inference_mode()
def batch_plain_generate(model: torch.nn.Module, prompts: list[torch.Tensor], max_new_tokens: int,
                         sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                         generator: torch.Generator | None = None) -> BatchResult:
    """One target pass per token for all unfinished rows (left padding, mask, explicit positions)."""
    rows = _rows(prompts)
    _check_budget(max_new_tokens)
    device = rows[0].device
    eos = _eos_tensor(eos_token_id, device)
    st = _Rows(rows, max_new_tokens + 1)
    kv = RaggedKV(model, len(rows), device)
    longest = max(st.plen_host)

    synchronize(device)
    t0 = time.perf_counter()
    logits = kv.feed(st.seq, st.plen, longest, len(set(st.plen_host)) == 1, 1)[:, -1]
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
                    kv.select(keep)
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


def _propose(draft: RaggedKV, st: _Rows, k: int, pending: list[int], sampling: SamplingConfig,
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """k proposals per row [B, k] (written into ``st.seq`` after each row's tokens) and their distributions [B, k, V]."""
    qs = []
    m0 = max(pending)
    for i in range(k):
        upto = st.length + i
        if i == 0:
            logits = draft.feed(st.seq, upto, m0, min(pending) == m0, 1)[:, -1]
        else:
            logits = draft.feed(st.seq, upto, 1, True, 1)[:, -1]
        if sampling.do_sample:
            q = logits_to_probs(logits, sampling)
            x = torch.multinomial(q, 1, generator=generator)
            qs.append(q)
        else:
            x = logits.argmax(dim=-1, keepdim=True)
        st.seq.scatter_(1, upto[:, None], x)
    props = st.seq.gather(1, st.length[:, None] + torch.arange(k, device=st.seq.device))
    return props, (torch.stack(qs, dim=1) if qs else None)


def _accept(proposals: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor, sampling: SamplingConfig,
            generator: torch.Generator | None, rule: AcceptRule) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts [B] and the target's next token [B], row by row with the batch-1 rules when sampling."""
    if not sampling.do_sample:
        return batch_accept_greedy(proposals, logits)
    p = logits_to_probs(logits, sampling)  # all rows and positions in one call
    if q is None:  # k = 0: nothing proposed, the rules then draw from p[0]
        q = p[:, :0]
    # The rules are pure functions of one row (vectorised over its proposals); B calls per iteration.
    res = [rule(proposals[b], p[b], q[b], generator) for b in range(proposals.shape[0])]
    n = torch.tensor([r[0] for r in res], device=proposals.device)
    return n, torch.tensor([r[1] for r in res], device=proposals.device)


@torch.inference_mode()
def batch_speculative_generate(target: torch.nn.Module, draft_model: torch.nn.Module, prompts: list[torch.Tensor],
                               max_new_tokens: int, k: int = 4, sampling: SamplingConfig = GREEDY,
                               eos_token_id: int | list[int] | None = None,
                               generator: torch.Generator | None = None, rule: AcceptRule = accept_sample,
                               compact_at: float | None = 0.25) -> BatchResult:
    """Draft k tokens per row, verify all rows in one target pass, keep each row's accepted prefix.

    ``rule`` is the sampling acceptance rule applied to each row (the wrong ones exist for tests);
    greedy uses ``accept_greedy`` semantics. ``compact_at``: re-pack a cache when its columns exceed
    a hole-free layout by this share of the longest row (None: never).
    """
    rows = _rows(prompts)
    _check_budget(max_new_tokens)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is not allowed: use an integer >= 1")
    device = rows[0].device
    eos = _eos_tensor(eos_token_id, device)
    st = _Rows(rows, max_new_tokens + k + 2)
    tkv, dkv = RaggedKV(target, len(rows), device), RaggedKV(draft_model, len(rows), device)
    steps = torch.arange(k + 1, device=device)
    acc = torch.zeros(len(rows), dtype=torch.long, device=device)
    prop, chk = torch.zeros_like(acc), torch.zeros_like(acc)

    synchronize(device)
    t0 = time.perf_counter()
    # Both models see all but the last prompt token; the first verification pass covers it.
    m = max(st.plen_host) - 1
    if m:
        uniform = len(set(st.plen_host)) == 1
        tkv.feed(st.seq, st.plen - 1, m, uniform, 1)
        dkv.feed(st.seq, st.plen - 1, m, uniform, 1)
    synchronize(device)
    prefill_s = time.perf_counter() - t0

    iterations: list[BatchIterationStats] = []
    generated = [0] * len(rows)  # host copy, per active row
    pending = [1] * len(rows)  # tokens the draft has not run yet, per active row
    while st.active:
        t_iter = time.perf_counter()
        rows_now = st.active
        # Never propose past the largest remaining budget; rows with less are truncated afterwards.
        k_eff = min(k, max_new_tokens - min(generated) - 1)
        d_sw, v_sw, r_sw, a_sw = (Stopwatch(device) for _ in range(4))
        m0 = tkv.layout.seconds + dkv.layout.seconds
        with d_sw:
            if k_eff:
                props, q = _propose(dkv, st, k_eff, pending, sampling, generator)
            else:
                props, q = st.seq.new_empty((rows_now, 0)), None
        with v_sw:
            logits = tkv.feed(st.seq, st.length + k_eff, k_eff + 1, True, k_eff + 1)
            n, nxt = _accept(props, q, logits, sampling, generator, rule)
        with r_sw:
            st.seq.scatter_(1, (st.length + n)[:, None], nxt[:, None])
            new_len = st.length + n + 1
            limit = st.plen + max_new_tokens
            if eos.numel():
                # First EOS among this iteration's tokens (accepted proposals and the target's own token).
                window = st.seq.gather(1, st.length[:, None] + steps[: k_eff + 1])
                hit = torch.isin(window, eos) & (steps[: k_eff + 1] <= n[:, None])
                has_eos = hit.any(dim=1)
                final = torch.minimum(torch.where(has_eos, st.length + hit.to(torch.int32).argmax(dim=1) + 1, new_len),
                                      limit)
                done = has_eos | (final >= limit)
            else:
                final = torch.minimum(new_len, limit)
                done = final >= limit
            d_pending = new_len - torch.minimum(dkv.seen, new_len - 1)  # what the draft must run next time
            t_width, d_width = tkv.width, dkv.width
            # The iteration's one read of device values.
            host = torch.cat([n, final, done.to(torch.long), d_pending,
                              tkv.masked_slots()[None], dkv.masked_slots()[None]]).tolist()
            n_h, final_h, done_h, pend_h = (host[i * rows_now:(i + 1) * rows_now] for i in range(4))
            t_masked, d_masked = host[-2:]
            max_n, min_n = max(n_h), min(n_h)
            # The target ran [last token, proposals]: row b keeps its first n_b + 1 columns.
            tkv.rollback(new_len - 1, k_eff - max_n, min_n != max_n)
            if k_eff:  # the draft ran its pending tokens and proposals 1..k-1: row b keeps those up to n_b
                d_max, d_min = min(max_n, k_eff - 1), min(min_n, k_eff - 1)
                dkv.rollback(new_len - 1, k_eff - 1 - d_max, d_min != d_max)
        acc.index_add_(0, st.row_id, n)
        prop.index_add_(0, st.row_id, torch.full_like(n, k_eff))
        chk.index_add_(0, st.row_id, torch.clamp(n + 1, max=k_eff))
        new_tokens = [f - p - g for f, p, g in zip(final_h, st.plen_host, generated)]
        generated = [g + t for g, t in zip(generated, new_tokens)]
        st.length = new_len
        dummies = max(pending) * rows_now - sum(pending) if k_eff else 0
        with a_sw:
            keep = st.finish([bool(d) for d in done_h], final_h)
            if keep is not None:
                if st.active:
                    tkv.select(keep)
                    dkv.select(keep)
                kept = keep.tolist()
                generated, pending = [generated[b] for b in kept], [pend_h[b] for b in kept]
            else:
                pending = pend_h
                if compact_at is not None:
                    longest = max(final_h) - 1  # the target's largest seen; the draft's is at most that
                    for kv in (tkv, dkv):
                        if kv.excess(longest) > compact_at * longest:
                            kv.compact(int(kv.seen.max()))
        iterations.append(BatchIterationStats(
            rows=rows_now, k=k_eff, accepted=sum(n_h), checked=sum(min(x + 1, k_eff) for x in n_h),
            bonus_rows=sum(1 for x in n_h if 0 < k_eff == x), new_tokens=sum(new_tokens),
            draft_s=d_sw.seconds, verify_s=v_sw.seconds, rollback_s=r_sw.seconds, realign_s=a_sw.seconds,
            mask_s=tkv.layout.seconds + dkv.layout.seconds - m0, total_s=time.perf_counter() - t_iter,
            masked_share=t_masked / (rows_now * t_width), draft_masked_share=d_masked / max(1, rows_now * d_width),
            dummy_inputs=dummies))
    synchronize(device)
    wall = time.perf_counter() - t0
    return BatchResult(st.outputs, [p.shape[0] for p in rows], wall, prefill_s, acc.tolist(), prop.tolist(),
                       chk.tolist(), iterations)
