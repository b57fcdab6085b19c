"""The speculative step (propose, verify, accept, roll back, record) over a set of rows, and the loop around it.

Both ``speculative_generate`` (one prompt) and ``batch_speculative_generate`` (B prompts) run
``run_speculative``: batch 1 is a batch of one row.

By default the prompt is not prefilled apart (``merge_prefill``): the draft's first call runs the
whole prompt and proposes, and the target's first verification pass runs the prompt and the first
proposals together, as transformers' assisted generation does; a generation then costs one target
pass (and one draft pass) fewer than prefill-then-verify. The rows' KV caches are ``RaggedKV`` layouts
(``speclab.decoding.batch_cache``); at one row, or while every row proposes the same number of tokens and
accepts the same number, they stay dense and the models run without an attention mask.

Rows may propose different numbers of tokens (a policy per row, prompt lookup finding matches of
different lengths, a hybrid's lookup rows next to its model rows): every feed is right-aligned, so
a row with fewer tokens than the widest gets masked dummy slots on the left, the same mechanism that
feeds the draft model's pending tokens. Row b's verification logits are then the last
``counts[b] + 1`` of the pass's ``max(counts) + 1``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.decoding.acceptance import AcceptRule, batch_accept_greedy
from speclab.decoding.batch_cache import RaggedKV
from speclab.decoding.drafters import Drafter, row_drafter
from speclab.decoding.k_policy import KPolicy, RowPolicies
from speclab.decoding.checks import check_call, draft_models
from speclab.decoding.rows import Rows, eos_tensor
from speclab.decoding.sampling import SamplingConfig, logits_to_probs
from speclab.decoding.timing import Stopwatch, synchronize


def finish_rule(st: Rows, new_len: torch.Tensor, n: torch.Tensor, width: int, limit: torch.Tensor,
                eos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's final length after this iteration and whether it is done: its first EOS among the
    iteration's tokens (accepted proposals and the target's own token), or its token budget."""
    if not eos.numel():
        final = torch.minimum(new_len, limit)
        return final, final >= limit
    steps = torch.arange(width + 1, device=n.device)
    hit = torch.isin(st.seq.gather(1, st.length[:, None] + steps), eos) & (steps <= n[:, None])
    has_eos = hit.any(dim=1)
    final = torch.minimum(torch.where(has_eos, st.length + hit.to(torch.int32).argmax(dim=1) + 1, new_len), limit)
    return final, has_eos | (final >= limit)


def accept_rows(st: Rows, counts: list[int], q: list[torch.Tensor | None] | None, logits: torch.Tensor,
                sampling: SamplingConfig, generator: torch.Generator | None,
                rule: AcceptRule) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts [B] and the target's next token [B]; row b's logits are the last counts[b] + 1."""
    width = logits.shape[1] - 1
    if not sampling.do_sample:
        props = st.seq.gather(1, st.length[:, None] + torch.arange(width, device=logits.device))
        if min(counts) == width:
            return batch_accept_greedy(props, logits)
        return batch_accept_greedy(props, logits, torch.tensor(counts, device=logits.device))
    p = logits_to_probs(logits, sampling)  # all rows and positions in one call
    res = []
    # The rules are pure functions of one row (vectorised over its proposals); B calls per iteration.
    for b, (c, length) in enumerate(zip(counts, st.length_h)):
        props = st.seq[b, length: length + c]
        qb = q[b] if q is not None and q[b] is not None else None
        if qb is None:  # a drafter without distributions proposes deterministically
            qb = torch.zeros_like(p[b, :c]).scatter_(1, props.view(-1, 1), 1.0)
        res.append(rule(props, p[b, width - c:], qb, generator))
    n = torch.tensor([r[0] for r in res], device=logits.device)
    return n, torch.tensor([r[1] for r in res], device=logits.device)


@dataclass
class Step:
    """What one iteration did, per row (host values) and in time."""

    lengths: list[int]  # each row's length before the iteration
    counts: list[int]  # proposals made
    accepted: list[int]
    final: list[int]  # each row's length after it (EOS / budget applied)
    done: list[bool]
    draft_s: float
    verify_s: float
    rollback_s: float
    mask_s: float
    draft_fed: int  # tokens in the draft model's first forward call (0: no model ran)
    draft_calls: int
    dummy_inputs: int  # masked dummy input slots fed (wasted token work)
    masked_share: float  # masked share of the target's key/value slots at the verify pass
    draft_masked_share: float  # the same for the draft model's cache at its last step (nan: no model)
    realign_s: float = 0.0
    total_s: float = 0.0
    target_fed: int = 0  # tokens per row in the target's verification pass (the widest row's)
    with_prompt: bool = False  # this iteration's passes also processed the prompt (a merged prefill)


def speculative_step(target: RaggedKV, drafter: Drafter, policies: RowPolicies, st: Rows, cap: int,
                     limit: torch.Tensor, eos: torch.Tensor, sampling: SamplingConfig,
                     generator: torch.Generator | None, rule: AcceptRule, seen: list[int]) -> Step:
    """One draft-verify-rollback iteration of every row; rows then hold their new tokens in ``st``.

    ``cap``: the most proposals any row may make (never past the largest remaining token budget; a
    row with less is cut to its budget afterwards, and the target's own token is always one more).
    ``seen``: the tokens of each row already in the target's cache (its length - 1, or 0 before a
    merged prefill's first pass).
    """
    device, lengths = st.seq.device, st.length_h
    d_sw, v_sw, r_sw = Stopwatch(device), Stopwatch(device), Stopwatch(device)
    caches = [target, *drafter.caches()]
    m0 = sum(kv.layout.seconds for kv in caches)
    with d_sw:
        # The policies see what the drafter has to go on (e.g. the matched n-gram) first.
        labels = drafter.label_rows(st.seq, lengths) if policies.conditioned and drafter.labelled else None
        ks = [min(k, cap) for k in policies.ks(labels)]
        counts, q = drafter.propose_rows(st.seq, st.length, lengths, ks, sampling, generator)
    width = max(counts)
    with v_sw:
        # Each row runs what the target has not seen: its last token and proposals, or, on a merged
        # prefill's first iteration, its whole prompt too. ``seen`` is one behind the length (host facts).
        fed = [n - s + c for n, s, c in zip(lengths, seen, counts)]
        ragged = len(set(fed)) > 1
        upto = st.length + (torch.tensor(counts, device=device) if min(counts) != width else width)
        logits = target.feed(st.seq, upto, max(fed), not ragged, width + 1)
        n, nxt = accept_rows(st, counts, q, logits, sampling, generator, rule)
    with r_sw:
        st.seq.scatter_(1, (st.length + n)[:, None], nxt[:, None])
        new_len = st.length + n + 1
        final, done = finish_rule(st, new_len, n, width, limit, eos)
        # Masked slots at the verify pass and the draft's last step (dense caches have none: no read).
        slots = [(kv.rows * kv.width, None if kv.dense else kv.masked_slots()[None]) for kv in caches]
        host = torch.cat([n, final, done.to(torch.long), *(m for _, m in slots if m is not None)]).tolist()
        b = len(counts)  # the iteration's one read of device values, above
        n_h, final_h, done_h, masked = host[:b], host[b: 2 * b], host[2 * b: 3 * b], iter(host[3 * b:])
        shares = [(0 if m is None else next(masked)) / max(1, size) for size, m in slots] + [float("nan")]
        # The target ran [last token, proposals], right-aligned: row b keeps its first n_b + 1 of them.
        lost = [c - a for c, a in zip(counts, n_h)]
        target.rollback(new_len - 1, min(lost), len(set(lost)) > 1)
        drafter.rollback_rows(new_len - 1, n_h)
    policies.update(counts, n_h)
    st.length, st.length_h = new_len, [x + a + 1 for x, a in zip(lengths, n_h)]
    d_fed, calls = (drafter.last_fed, drafter.last_calls) if width else (0, 0)
    return Step(lengths, counts, n_h, final_h, [bool(d) for d in done_h], d_sw.seconds, v_sw.seconds,
                r_sw.seconds, sum(kv.layout.seconds for kv in caches) - m0, d_fed, calls,
                drafter.last_dummies + sum(max(fed) - f for f in fed), shares[0], shares[1],
                target_fed=max(fed), with_prompt=any(s < n - 1 for n, s in zip(lengths, seen)))


@dataclass
class Run:
    tokens: list[list[int]]  # new tokens of each row, in prompt order
    wall_s: float  # prefill included
    prefill_s: float
    steps: list[Step] = field(default_factory=list)
    row_ids: list[list[int]] = field(default_factory=list)  # per step: the prompt index of each row


def run_speculative(target: torch.nn.Module, drafter: object, prompts: list[torch.Tensor], max_new_tokens: int,
                    k: int | KPolicy, sampling: SamplingConfig, eos_token_id: int | list[int] | None,
                    generator: torch.Generator | None, rule: AcceptRule, compact_at: float | None,
                    merge_prefill: bool = True) -> Run:
    """Speculative decoding of every prompt (1-D token ids) until EOS or ``max_new_tokens``.

    ``drafter``: a drafter (``speclab.decoding.drafters``) or a draft model; ``k``: a fixed number of
    proposals or a k policy (each row gets its own: the given one for the first row, copies for the
    others). ``compact_at``: re-pack a cache when its columns exceed a hole-free layout by this share
    of the longest row (None: never). ``merge_prefill``: the prompt rides in the first iteration's
    passes (False: both models first prefill all but its last token, then the loop starts).
    """
    policies = RowPolicies(k, len(prompts))
    drafter = row_drafter(drafter)
    checked = check_call(target, draft_models(drafter), prompts, max_new_tokens, eos_token_id, k)
    max_new_tokens, device = checked.max_new_tokens, prompts[0].device
    eos = eos_tensor(checked.eos, device)
    # A row proposes at most max_new_tokens - 1 tokens past a length of at most prompt + max_new_tokens - 1.
    st = Rows(prompts, 2 * max_new_tokens + 1)
    tkv = RaggedKV(target, len(prompts), device)
    limit = st.plen + max_new_tokens

    synchronize(device)
    t0 = time.perf_counter()
    # Apart: both models see all but the last prompt token; the first verification pass covers it.
    ctx_h = [0] * len(prompts) if merge_prefill else [n - 1 for n in st.plen_h]
    if max(ctx_h):
        tkv.feed(st.seq, st.plen - 1, max(ctx_h), len(set(ctx_h)) == 1, 1)
    drafter.start_rows(st.seq, torch.tensor(ctx_h, device=device), ctx_h)
    synchronize(device)
    run = Run([], 0.0, time.perf_counter() - t0)

    generated = [0] * len(prompts)  # per active row
    while st.active:
        t_iter = time.perf_counter()
        run.row_ids.append(list(st.row_ids))
        step = speculative_step(tkv, drafter, policies, st, max_new_tokens - min(generated) - 1, limit, eos,
                                sampling, generator, rule, ctx_h)
        ctx_h = [n - 1 for n in st.length_h]
        generated = [f - p for f, p in zip(step.final, st.plen_h)]
        a_sw = Stopwatch(device)
        with a_sw:  # finished rows leave; holes are re-packed
            kept = st.finish(step.done, step.final)
            if kept is not None:
                ctx_h = [ctx_h[b] for b in kept[1]]
                if st.active:
                    tkv.select(kept[0])
                    drafter.select_rows(*kept)
                    policies.select(kept[1])
                generated, limit = [generated[b] for b in kept[1]], st.plen + max_new_tokens
            elif compact_at is not None:
                longest = max(step.final) - 1  # the target's largest seen; a draft's is at most that
                for kv in (tkv, *drafter.caches()):
                    if kv.excess(longest) > compact_at * longest:
                        kv.compact(int(kv.seen.max()))
        step.realign_s = a_sw.seconds
        step.total_s = time.perf_counter() - t_iter
        run.steps.append(step)
    synchronize(device)
    run.wall_s = time.perf_counter() - t0
    run.tokens = st.outputs
    return run
