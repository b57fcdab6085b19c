"""Step and pass times of a model after a prompt: the c_draft and c_verify of the cost model."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from speclab.cache import crop_to, forward_logits, new_cache
from speclab.timing import Stopwatch


@dataclass(frozen=True)
class PassTiming:
    pass_len: int  # new tokens in the pass
    median_s: float
    q25_s: float
    q75_s: float
    samples: int


def pass_times(model: torch.nn.Module, prompt_ids: torch.Tensor, pass_lengths: list[int],
               repeats: int = 20, warmup: int = 3) -> list[PassTiming]:
    """Median time of one forward pass over n new tokens on top of the prompt's cache, per n.

    The cache is cut back after every pass (outside the timed region), so every pass sees the
    same context length. Lengths are interleaved round by round so that slow drift of the
    machine spreads over all of them instead of biasing one.
    """
    if any(n < 1 for n in pass_lengths):
        raise ValueError(f"pass lengths {pass_lengths} are not allowed: each must be >= 1")
    device = prompt_ids.device
    cache = new_cache(model)
    forward_logits(model, prompt_ids, cache, 1)
    ctx = cache.get_seq_length()
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    new = torch.randint(0, vocab, (1, max(pass_lengths)), generator=gen).to(device)
    samples: dict[int, list[float]] = {n: [] for n in pass_lengths}
    for rep in range(warmup + repeats):
        for n in pass_lengths:
            sw = Stopwatch(device)
            with sw:
                forward_logits(model, new[:, :n], cache, n)
            crop_to(cache, ctx)
            if rep >= warmup:
                samples[n].append(sw.seconds)
    out = []
    for n in pass_lengths:
        s = sorted(samples[n])
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
        out.append(PassTiming(n, statistics.median(s), q[0], q[2], len(s)))
    return out
