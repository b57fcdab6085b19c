"""Plain decoding (the baseline) and the speculative loop, with per-step timing."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.acceptance import AcceptRule, accept_greedy, accept_sample, checked_proposals
from speclab.cache import crop_to, forward_logits, new_cache
from speclab.drafters import Drafter, ModelDrafter
from speclab.k_policy import FixedK, KPolicy
from speclab.sampling import GREEDY, SamplingConfig, choose_token, logits_to_probs
from speclab.timing import Stopwatch, synchronize


@dataclass
class IterationStats:
    """One draft-verify-rollback iteration."""

    k: int  # proposals made
    accepted: int
    bonus: bool  # every proposal accepted, the target's last row supplied a bonus token
    new_tokens: int  # tokens appended to the output (after EOS / length truncation)
    draft_s: float
    verify_s: float
    rollback_s: float
    total_s: float
    length: int = 0  # tokens in the sequence (prompt included) before the iteration: its context
    draft_fed: int = 0  # tokens in the draft model's first forward call (its catch-up); 0: no model ran
    draft_calls: int = 0  # draft model forward calls

    @property
    def checked(self) -> int:
        """Proposals the target actually judged: the accepted ones and the first rejected one, if any."""
        return int(checked_proposals(self.accepted, self.k))

    @property
    def bookkeeping_s(self) -> float:
        return self.total_s - self.draft_s - self.verify_s - self.rollback_s


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only
    prompt_len: int
    wall_s: float  # prefill included
    prefill_s: float
    step_s: list[float] = field(default_factory=list)  # plain: one per decode step after prefill
    iterations: list[IterationStats] = field(default_factory=list)  # speculative only

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def proposed(self) -> int:
        return sum(it.k for it in self.iterations)

    @property
    def accepted(self) -> int:
        return sum(it.accepted for it in self.iterations)

    @property
    def checked(self) -> int:
        return sum(it.checked for it in self.iterations)

    @property
    def acceptance_rate(self) -> float:
        """alpha-hat: accepted / checked proposals (the i.i.d. model's maximum-likelihood estimate).

        Proposals after the first rejection were never judged, so counting them as failures
        (accepted / proposed) would make alpha fall with k for the same text and pair.
        """
        return self.accepted / self.checked if self.checked else float("nan")

    @property
    def proposal_efficiency(self) -> float:
        """accepted / proposed: the share of draft work that ended up in the output."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_target_pass(self) -> float:
        n = len(self.iterations)
        return sum(it.new_tokens for it in self.iterations) / n if n else float("nan")


def _check_prompt(input_ids: torch.Tensor) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [1, n>=1]; got {tuple(input_ids.shape)}")


def _buffer(input_ids: torch.Tensor, extra: int) -> torch.Tensor:
    ids = input_ids.new_zeros((1, input_ids.shape[1] + extra))
    ids[:, : input_ids.shape[1]] = input_ids
    return ids


def _first_eos(tokens: list[int], eos: set[int]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in eos), None)


def _eos_set(eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


@torch.inference_mode()
def plain_generate(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                   generator: torch.Generator | None = None) -> GenerationResult:
    """One target pass per token. ``step_s`` holds each decode step's synchronised time."""
    _check_prompt(input_ids)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")
    device = input_ids.device
    eos = _eos_set(eos_token_id)
    cache = new_cache(model)
    synchronize(device)
    t0 = time.perf_counter()
    logits = forward_logits(model, input_ids, cache, 1)[-1]
    tok = choose_token(logits, sampling, generator)
    synchronize(device)
    prefill_s = time.perf_counter() - t0
    tokens, steps = [tok], []
    nxt = torch.empty((1, 1), dtype=input_ids.dtype, device=device)
    while len(tokens) < max_new_tokens and tok not in eos:
        sw = Stopwatch(device)
        with sw:
            nxt.fill_(tok)
            logits = forward_logits(model, nxt, cache, 1)[-1]
            tok = choose_token(logits, sampling, generator)
        steps.append(sw.seconds)
        tokens.append(tok)
    synchronize(device)
    return GenerationResult(tokens, input_ids.shape[1], time.perf_counter() - t0, prefill_s, step_s=steps)


def plain_greedy(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                 eos_token_id: int | list[int] | None = None) -> GenerationResult:
    return plain_generate(model, input_ids, max_new_tokens, GREEDY, eos_token_id)


@torch.inference_mode()
def speculative_generate(target: torch.nn.Module, drafter: Drafter | torch.nn.Module, input_ids: torch.Tensor,
                         max_new_tokens: int, k: int | KPolicy = 4, sampling: SamplingConfig = GREEDY,
                         eos_token_id: int | list[int] | None = None,
                         generator: torch.Generator | None = None,
                         rule: AcceptRule = accept_sample) -> GenerationResult:
    """Draft up to k tokens, verify them in one target pass, keep the accepted prefix, roll both caches back.

    ``drafter`` is a Drafter or a plain draft model (wrapped in a ModelDrafter); ``k`` is a fixed
    number of proposals or a KPolicy that picks it per iteration. ``rule`` is the sampling
    acceptance rule (the wrong ones exist for tests); greedy always uses ``accept_greedy``.
    """
    _check_prompt(input_ids)
    # Anything that is not a policy is a fixed k; FixedK accepts any integral type and rejects the rest.
    policy = k if hasattr(k, "start") and hasattr(k, "update") else FixedK(k)
    policy.start()
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")
    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter)
    conditioned = hasattr(policy, "condition") and hasattr(drafter, "label")
    device = input_ids.device
    eos = _eos_set(eos_token_id)
    n_prompt = input_ids.shape[1]
    ids = _buffer(input_ids, max_new_tokens + 1)
    length = n_prompt
    tcache = new_cache(target)

    synchronize(device)
    t0 = time.perf_counter()
    # Both models see all but the last prompt token; the first verification pass covers it.
    if n_prompt > 1:
        forward_logits(target, ids[:, : n_prompt - 1], tcache, 1)
    drafter.start(ids, n_prompt - 1)
    synchronize(device)
    prefill_s = time.perf_counter() - t0

    iterations: list[IterationStats] = []
    while length - n_prompt < max_new_tokens:
        t_iter = time.perf_counter()
        d_sw, v_sw, r_sw = Stopwatch(device), Stopwatch(device), Stopwatch(device)
        with d_sw:
            if conditioned:  # the policy sees what the drafter has to go on (e.g. the matched n-gram) first
                policy.condition(drafter.label(ids, length))
            # Never propose past the token budget: the target's own token is always one more.
            k_eff = min(policy.k, max_new_tokens - (length - n_prompt) - 1)
            proposals, q = drafter.propose(ids, length, k_eff, sampling, generator) if k_eff else (ids.new_empty(0), None)
        k_used = proposals.shape[0]
        with v_sw:
            ids[0, length: length + k_used] = proposals
            seen = tcache.get_seq_length()
            logits = forward_logits(target, ids[:, seen: length + k_used], tcache, k_used + 1)
            if sampling.do_sample:
                p = logits_to_probs(logits, sampling)
                if q is None:  # a drafter without distributions proposes deterministically
                    q = torch.zeros_like(p[:k_used]).scatter_(1, proposals.view(-1, 1), 1.0)
                n_acc, nxt = rule(proposals, p, q, generator)
            else:
                n_acc, nxt = accept_greedy(proposals, logits)
        with r_sw:
            ids[0, length + n_acc] = nxt
            new_len = length + n_acc + 1
            # The target keeps the accepted proposals, not its own token (not yet run through it).
            crop_to(tcache, new_len - 1)
            drafter.rollback(new_len - 1)
        policy.update(k_used, n_acc)
        new = ids[0, length:new_len].tolist()
        cut = _first_eos(new, eos)
        if cut is not None:
            new_len = length + cut + 1
        iterations.append(IterationStats(
            k=k_used, accepted=n_acc, bonus=0 < k_used == n_acc, new_tokens=new_len - length,
            draft_s=d_sw.seconds, verify_s=v_sw.seconds, rollback_s=r_sw.seconds,
            total_s=time.perf_counter() - t_iter, length=length,
            draft_fed=getattr(drafter, "last_fed", 0) if k_used else 0,
            draft_calls=getattr(drafter, "last_calls", 0) if k_used else 0,
        ))
        length = new_len
        if cut is not None:
            break
    synchronize(device)
    wall = time.perf_counter() - t0
    return GenerationResult(ids[0, n_prompt:length].tolist(), n_prompt, wall, prefill_s, iterations=iterations)
