"""What a greedy replay (``speclab.drafting.replay``) needs from the models: the target's plain greedy tokens and
the draft's greedy choice at each of them, from one teacher-forced pass of the draft."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import torch

from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.checks import eos_ids
from speclab.decoding.k_policy import KPolicy
from speclab.decoding.loop import plain_greedy
from speclab.drafting.replay import Replay, replay


@torch.inference_mode()
def draft_choices_stepwise(draft: torch.nn.Module, prompt_ids: torch.Tensor, tokens: list[int]) -> list[int]:
    """The draft's greedy choice for each of ``tokens`` as the loop's draft computes it: the prompt in one
    call (the merged prefill's first draft call), then one token a call on a KV cache.

    A teacher-forced pass over the whole text (``draft_choices``) is one call, but a dynamically quantized
    draft (int8: activations quantized with one scale per call) then sees other activation scales than in
    the loop, and its choices move far beyond fp near-ties (on SmolLM2's int8 draft, most iterations'
    counts differ). Stepwise, only the loop's two-token catch-up calls still differ from it."""
    if not tokens:
        return []
    cache = new_cache(draft)
    out = [int(forward_logits(draft, prompt_ids.long(), cache, 1)[-1].argmax())]
    step = torch.empty((1, 1), dtype=torch.long, device=prompt_ids.device)
    for t in tokens[:-1]:
        step.fill_(t)
        out.append(int(forward_logits(draft, step, cache, 1)[-1].argmax()))
    return out


@torch.inference_mode()
def draft_choices(draft: torch.nn.Module, prompt_ids: torch.Tensor, tokens: list[int]) -> list[int]:
    """The draft's greedy choice for each of ``tokens`` given the prompt and the tokens before it:
    one forward pass over prompt + tokens[:-1] (teacher forcing), logits kept for the last positions only."""
    if not tokens:
        return []
    text = torch.cat([prompt_ids[0].long(), torch.tensor(tokens[:-1], dtype=torch.long, device=prompt_ids.device)])
    logits = draft(input_ids=text[None], use_cache=False, logits_to_keep=len(tokens)).logits[0]
    return logits.argmax(dim=-1).tolist()


def target_tokens(target: torch.nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                  eos_token_id: int | list[int] | None = None, lookahead: int = 10) -> tuple[list[int], int]:
    """The target's plain greedy output, and up to ``lookahead`` more tokens past an EOS that ended it early
    (the loop's last iteration may propose past the EOS, and its accepted count there depends on them):
    (tokens, length of the output proper)."""
    out = plain_greedy(target, prompt_ids, max_new_tokens, eos_token_id).tokens
    n_out, extra = len(out), min(lookahead, max_new_tokens - len(out))
    if extra > 0 and set(eos_ids(eos_token_id)).intersection(out[-1:]):
        # A second prefill over prompt + output: the loop's verify pass sees the same text there.
        done = torch.tensor([out], dtype=prompt_ids.dtype, device=prompt_ids.device)
        out = out + plain_greedy(target, torch.cat([prompt_ids, done], dim=1), extra).tokens
    return out, n_out


@dataclass
class GreedyReference:
    """One prompt's greedy target output (and lookahead past its EOS) and the draft's choices over it."""

    prompt: list[int]
    target: list[int]
    draft: list[int] | None  # None: no draft model (prompt lookup only)
    output_len: int  # the target's output proper: target[:output_len]
    max_new_tokens: int
    eos_token_id: int | list[int] | None = None

    @property
    def output(self) -> list[int]:
        return self.target[: self.output_len]

    def replay(self, drafter: object, k: int | KPolicy, merge_prefill: bool = True) -> Replay:
        """The loop's iterations with this drafter (``speclab.drafting.replay.ReplayDrafter`` or a loop drafter) and k."""
        return replay(self.prompt, self.target, self.draft, drafter, k, self.max_new_tokens, self.eos_token_id,
                      merge_prefill)

    def replay_all(self, drafter: object, ks: dict[Hashable, int | KPolicy]) -> dict[Hashable, Replay]:
        return {name: self.replay(drafter, k) for name, k in ks.items()}


def greedy_reference(target: torch.nn.Module, draft: torch.nn.Module | None, prompt_ids: torch.Tensor,
                     max_new_tokens: int, eos_token_id: int | list[int] | None = None,
                     lookahead: int = 10, draft_pass: str = "stepwise") -> GreedyReference:
    """One plain greedy generation of the target and the draft's choices over it.

    ``lookahead``: tokens generated past an early EOS; a replay with k up to lookahead + 1 then knows
    every verdict of its last iteration (``Replay.complete``). ``draft_pass``: "stepwise" (one draft step
    a token, as the loop runs it: ``draft_choices_stepwise``) or "teacher_forced" (one pass; exact up to
    fp near-ties for a draft whose output does not depend on what else is in the call)."""
    passes = {"stepwise": draft_choices_stepwise, "teacher_forced": draft_choices}
    if draft_pass not in passes:
        raise ValueError(f"draft_pass={draft_pass!r} is not allowed: use one of {sorted(passes)}")
    tokens, n_out = target_tokens(target, prompt_ids, max_new_tokens, eos_token_id, lookahead)
    choices = None if draft is None else passes[draft_pass](draft, prompt_ids, tokens)
    return GreedyReference(prompt_ids[0].tolist(), tokens, choices, n_out, max_new_tokens, eos_token_id)
