"""Step and pass times of a model after a prompt: the c_draft and c_verify of the cost model."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from speclab.decoding.cache import crop_to, forward_logits, new_cache
from speclab.decoding.timing import Stopwatch
from speclab.trees.tree import Tree, check_tree_model, tree_forward, tree_inputs


@dataclass(frozen=True)
class PassTiming:
    pass_len: int  # new tokens in the pass
    median_s: float
    q25_s: float
    q75_s: float
    samples: int


def pass_timing(pass_len: int, s: list[float]) -> PassTiming:
    """Median and quartiles of one pass length's timed samples (an engine's own timings are summarised alike)."""
    s = sorted(s)
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return PassTiming(pass_len, statistics.median(s), q[0], q[2], len(s))


def pass_times(model: torch.nn.Module, prompt_ids: torch.Tensor, pass_lengths: list[int],
               repeats: int = 20, warmup: int = 3, progress: str | None = None, batch_size: int = 1,
               context_extra: int = 0) -> list[PassTiming]:
    """Median time of one forward pass over n new tokens on top of the prompt's cache, per n.

    The cache is cut back after every pass (outside the timed region), so every pass sees the
    same context length. Lengths are interleaved round by round so that slow drift of the
    machine spreads over all of them instead of biasing one. ``progress``: a label for a progress bar.
    ``batch_size`` B > 1 times the pass for B rows of the same prompt at once (B x n new tokens).
    ``context_extra`` tokens are appended to the prompt first, so the passes see a longer context
    (a generation's context grows by one token per token generated).
    """
    if any(n < 1 for n in pass_lengths):
        raise ValueError(f"pass lengths {pass_lengths} are not allowed: each must be >= 1")
    if context_extra < 0:
        raise ValueError(f"context_extra={context_extra} is not allowed: use an integer >= 0")
    device = prompt_ids.device
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    extra = torch.randint(0, vocab, (1, context_extra), generator=gen).to(device)
    prompt_ids = torch.cat([prompt_ids[:1], extra], dim=1).expand(batch_size, -1)
    cache = new_cache(model)
    forward_logits(model, prompt_ids, cache, 1)
    ctx = cache.get_seq_length()
    new = torch.randint(0, vocab, (batch_size, max(pass_lengths)), generator=gen).to(device)
    samples: dict[int, list[float]] = {n: [] for n in pass_lengths}
    reps = range(warmup + repeats)
    for rep in tqdm(reps, desc=progress, leave=False) if progress else reps:
        for n in pass_lengths:
            sw = Stopwatch(device)
            with sw:
                forward_logits(model, new[:, :n], cache, n)
            crop_to(cache, ctx)
            if rep >= warmup:
                samples[n].append(sw.seconds)
    return [pass_timing(n, samples[n]) for n in pass_lengths]


def tree_pass_times(model: torch.nn.Module, prompt_ids: torch.Tensor, node_counts: list[int], repeats: int = 20,
                    warmup: int = 3) -> list[PassTiming]:
    """Median time of the target's tree verification after the prompt, per number of nodes n: one pass over
    the last context token and n nodes of a binary tree, with the 4D tree mask and explicit position ids
    (``speclab.trees.tree_loop``). ``pass_len`` is n + 1, as a chain's pass over k proposals has k + 1 tokens.
    Counts are interleaved round by round, as in ``pass_times``."""
    if any(n < 1 for n in node_counts):
        raise ValueError(f"tree node counts {node_counts} are not allowed: each must be >= 1")
    check_tree_model(model)
    device = prompt_ids.device
    gen = torch.Generator(device="cpu").manual_seed(0)
    cache = new_cache(model)
    forward_logits(model, prompt_ids[:1, :-1], cache, 1)
    ctx = cache.get_seq_length()
    nodes = torch.randint(0, model.config.vocab_size, (max(node_counts),), generator=gen).to(device)
    inputs = {}
    for n in node_counts:
        tree = Tree(nodes[:n], [i // 2 - 1 for i in range(n)])  # two children per node, breadth first
        inputs[n] = (torch.cat([prompt_ids[0, -1:], tree.tokens]), *tree_inputs(tree, ctx, ctx + 1))
    samples: dict[int, list[float]] = {n: [] for n in node_counts}
    for rep in range(warmup + repeats):
        for n in node_counts:
            sw = Stopwatch(device)
            with sw:
                tree_forward(model, cache, *inputs[n], n + 1)
            crop_to(cache, ctx)
            if rep >= warmup:
                samples[n].append(sw.seconds)
    return [pass_timing(n + 1, samples[n]) for n in node_counts]


def prefill_times(model: torch.nn.Module, prompt_ids: torch.Tensor, lengths: list[int], repeats: int = 10,
                  warmup: int = 2) -> list[PassTiming]:
    """Median time of a prefill: one pass over the first n prompt tokens into an empty cache, per n.

    The speculative loop prefills both models with all but the last prompt token (n - 1), plain
    decoding prefills the target with all n: a time model needs both.
    """
    if any(not 1 <= n <= prompt_ids.shape[1] for n in lengths):
        raise ValueError(f"prefill lengths {lengths} are not allowed: each must be in 1..{prompt_ids.shape[1]}")
    samples: dict[int, list[float]] = {n: [] for n in lengths}
    for rep in range(warmup + repeats):
        for n in lengths:
            cache = new_cache(model)
            sw = Stopwatch(prompt_ids.device)
            with sw:
                forward_logits(model, prompt_ids[:1, :n], cache, 1)
            if rep >= warmup:
                samples[n].append(sw.seconds)
    return [pass_timing(n, samples[n]) for n in lengths]


@dataclass(frozen=True)
class StepCosts:
    """What the cost model needs: a target step, a draft step, and the verification pass per k."""

    target_step_s: float
    draft_step_s: float  # 0 without a draft model (a lookup costs microseconds)
    verify_s: dict[int, float]  # k -> target pass over k + 1 new tokens

    @property
    def c_draft(self) -> float:
        return self.draft_step_s / self.target_step_s

    @property
    def c_verify(self) -> dict[int, float]:
        return {k: v / self.target_step_s for k, v in self.verify_s.items()}


def step_costs(target: torch.nn.Module, draft: torch.nn.Module | None, prompt_ids: torch.Tensor, ks: list[int],
               repeats: int = 10, warmup: int = 2, progress: str | None = None) -> StepCosts:
    """Median target step, draft step and verification pass (k+1 new tokens) for each k, after the prompt."""
    label = (lambda who: f"{progress}: {who}") if progress else (lambda who: None)
    t = {p.pass_len: p.median_s
         for p in pass_times(target, prompt_ids, sorted({1, *(k + 1 for k in ks)}), repeats, warmup, label("target"))}
    d = pass_times(draft, prompt_ids, [1], repeats, warmup, label("draft"))[0].median_s if draft is not None else 0.0
    return StepCosts(t[1], d, {k: t[k + 1] for k in ks})
