"""Plain decoding (the baseline) and the speculative loop, with per-step timing."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.decoding.acceptance import AcceptRule, accept_sample, checked_proposals
from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.drafters import Drafter, OneRowDrafter
from speclab.decoding.k_policy import KPolicy
from speclab.decoding.checks import check_call
from speclab.decoding.sampling import GREEDY, SamplingConfig, choose_token
from speclab.decoding.step import run_speculative
from speclab.decoding.timing import Stopwatch, synchronize


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
    target_fed: int = 0  # tokens in the target's verification pass (proposals + 1, plus the prompt if merged)
    with_prompt: bool = False  # the iteration's passes also processed the prompt (a merged prefill)
    tree_nodes: int = 0  # proposals of a tree draft, all checked in one pass (0: a chain, whose k is its size)
    draft_widths: list[int] = field(default_factory=list)  # a tree draft's model calls, in tokens each

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
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids of type {type(input_ids).__name__} is not allowed: use a tensor of token ids "
                         "of shape [1, n>=1]")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [1, n>=1]; got {tuple(input_ids.shape)}")


@torch.inference_mode()
def plain_generate(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                   generator: torch.Generator | None = None) -> GenerationResult:
    """One target pass per token. ``step_s`` holds each decode step's synchronised time."""
    _check_prompt(input_ids)
    checked = check_call(model, [], [input_ids[0]], max_new_tokens, eos_token_id)
    max_new_tokens, eos = checked.max_new_tokens, set(checked.eos)
    input_ids = input_ids.long()
    device = input_ids.device
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
def speculative_generate(target: torch.nn.Module, drafter: Drafter | OneRowDrafter | torch.nn.Module,
                         input_ids: torch.Tensor, max_new_tokens: int, k: int | KPolicy = 4,
                         sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                         generator: torch.Generator | None = None,
                         rule: AcceptRule = accept_sample, merge_prefill: bool = True) -> GenerationResult:
    """Draft up to k tokens, verify them in one target pass, keep the accepted prefix, roll both caches back.

    ``drafter`` is a drafter or a plain draft model (wrapped in a ModelDrafter); ``k`` is a fixed
    number of proposals or a KPolicy that picks it per iteration. ``rule`` is the sampling
    acceptance rule (the wrong ones exist for tests); greedy always uses ``accept_greedy``.
    ``merge_prefill``: the prompt rides in the first iteration's passes (``prefill_s`` then holds
    only the drafter's start); False: both models prefill all but its last token first. The step is
    ``speclab.decoding.step``'s, over a batch of one row.
    """
    _check_prompt(input_ids)
    run = run_speculative(target, drafter, [input_ids[0]], max_new_tokens, k, sampling, eos_token_id, generator,
                          rule, compact_at=None, merge_prefill=merge_prefill)
    iterations = [IterationStats(
        k=s.counts[0], accepted=s.accepted[0], bonus=0 < s.counts[0] == s.accepted[0],
        new_tokens=s.final[0] - s.lengths[0], draft_s=s.draft_s, verify_s=s.verify_s, rollback_s=s.rollback_s,
        total_s=s.total_s, length=s.lengths[0], draft_fed=s.draft_fed, draft_calls=s.draft_calls,
        target_fed=s.target_fed, with_prompt=s.with_prompt,
    ) for s in run.steps]
    return GenerationResult(run.tokens[0], input_ids.shape[1], run.wall_s, run.prefill_s, iterations=iterations)
