"""Turning logits into the distribution that is actually sampled from.

The same transformation must be applied to the target's and the draft's logits
before any acceptance ratio is formed, otherwise the acceptance rule preserves a
distribution nobody samples from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How a next token is chosen. ``do_sample=False`` is greedy (arg-max)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus filtering

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"temperature={self.temperature} is not allowed with sampling: use a value > 0 "
                "(or do_sample=False for greedy decoding)"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is not allowed: use 0 (off) or a positive integer")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} is not allowed: use a value in (0, 1]")


GREEDY = SamplingConfig()


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Probabilities over the last dimension after temperature, top-k and top-p (float32)."""
    x = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p;
        # the most likely token always survives.
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def choose_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """One token from a single row of logits: arg-max, or a draw from the processed distribution."""
    if not cfg.do_sample:
        return int(torch.argmax(logits))
    probs = logits_to_probs(logits, cfg)
    return int(torch.multinomial(probs, 1, generator=generator))
