"""Choosing contexts where a distribution test has power: where target and draft disagree most."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.loop import plain_greedy
from speclab.decoding.sampling import SamplingConfig, logits_to_probs


@dataclass
class Context:
    ids: torch.Tensor  # [1, n] the tokens before the position
    p: torch.Tensor  # target's next-token distribution [V] (after sampling transforms)
    q: torch.Tensor  # draft's
    position: int  # index of the predicted token in the full sequence
    total_variation: float


@torch.inference_mode()
def distributions_along(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, first: int,
                        sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q for predicting tokens first..n-1 of ``ids``, each from one full pass per model."""
    n = ids.shape[1]
    rows = n - first + 1  # positions first-1 .. n-1 predict tokens first .. n
    lt = forward_logits(target, ids, new_cache(target), rows)
    ld = forward_logits(draft, ids, new_cache(draft), rows)
    return logits_to_probs(lt, sampling).double(), logits_to_probs(ld, sampling).double()


def max_tv_contexts(target: torch.nn.Module, draft: torch.nn.Module, prompt: torch.Tensor, n_new: int,
                    n_contexts: int, sampling: SamplingConfig) -> list[Context]:
    """The ``n_contexts`` positions of the prompt's greedy continuation with the largest TV(p, q)."""
    gen = plain_greedy(target, prompt, n_new).tokens
    seq = torch.cat([prompt, torch.tensor([gen], dtype=prompt.dtype, device=prompt.device)], dim=1)
    first = prompt.shape[1]
    p, q = distributions_along(target, draft, seq, first, sampling)
    tv = 0.5 * (p - q).abs().sum(dim=-1)
    best = torch.argsort(tv, descending=True)[:n_contexts].tolist()
    return [Context(seq[:, : first + i], p[i], q[i], first + i, float(tv[i])) for i in sorted(best)]


def prompt_context(target: torch.nn.Module, draft: torch.nn.Module, prompt: torch.Tensor,
                   sampling: SamplingConfig) -> Context:
    """The next-token distributions right after the prompt."""
    n = prompt.shape[1]
    p, q = distributions_along(target, draft, prompt, n, sampling)
    return Context(prompt, p[-1], q[-1], n, float(0.5 * (p[-1] - q[-1]).abs().sum()))
