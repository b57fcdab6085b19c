"""Speculative decoding with tree-shaped drafts (one sequence): propose a tree, verify every node in one
target pass, keep the accepted root path in both caches.

Each iteration's target pass feeds what the target has not run (its pending context tokens: the last
accepted token, or the whole prompt on a merged first iteration, causal among themselves) followed by
every tree node, each seeing the context, its ancestors and itself at position context length - 1 +
depth. The walk from the root accepts a path (greedy: each token the target's arg-max at its parent;
sampling: the multi-candidate rule at every node), the target's token after it is appended, and both
caches keep the context plus the path's slots (``speclab.trees.path_cache.keep_path``): the next iteration
starts as after a chain. Results are ``speclab.decoding.loop``'s, with ``k`` the tree's depth (the proposals on
its longest path, so ``accepted / checked`` is the acceptance per depth) and ``tree_nodes`` its size.
"""
from __future__ import annotations

import time

import torch

from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.checks import check_call, draft_models
from speclab.decoding.loop import GenerationResult, IterationStats, _check_prompt
from speclab.decoding.sampling import GREEDY, SamplingConfig, logits_to_probs
from speclab.decoding.timing import Stopwatch, synchronize
from speclab.trees.tree import Tree, check_tree_model, tree_forward, tree_inputs, walk_greedy, walk_sample
from speclab.trees.path_cache import check_plain_cache, keep_path
from speclab.trees.tree_drafters import TreeDrafter
from speclab.trees.multi_candidate import accept_candidates


def verify_tree(target: torch.nn.Module, cache: object, seq: torch.Tensor, seen: int, length: int,
                tree: Tree) -> torch.Tensor:
    """The target's logits at the root (after ``seq[0, :length]``) and at every node [n + 1, V], from one
    pass over ``seq[0, seen:length]`` and the tree's nodes."""
    if not tree.n:
        return forward_logits(target, seq[:, seen:length], cache, 1)
    allow, positions = tree_inputs(tree, seen, length)
    return tree_forward(target, cache, torch.cat([seq[0, seen:length], tree.tokens]), allow, positions, tree.n + 1)


@torch.inference_mode()
def tree_generate(target: torch.nn.Module, drafter: TreeDrafter, input_ids: torch.Tensor, max_new_tokens: int,
                  sampling: SamplingConfig = GREEDY, eos_token_id: int | list[int] | None = None,
                  generator: torch.Generator | None = None, rule=accept_candidates,
                  merge_prefill: bool = True) -> GenerationResult:
    """Tree speculative decoding of one prompt ([1, n]) until EOS or ``max_new_tokens``.

    ``rule``: the multi-candidate sampling rule (``speclab.trees.multi_candidate``; the wrong one exists for tests);
    greedy always walks by arg-max. ``merge_prefill``: the prompt rides in the first iteration's passes.
    """
    _check_prompt(input_ids)
    check_tree_model(target)
    checked = check_call(target, draft_models(drafter), [input_ids[0]], max_new_tokens, eos_token_id)
    max_new_tokens, eos = checked.max_new_tokens, set(checked.eos)
    device, plen = input_ids.device, input_ids.shape[1]
    seq = torch.zeros((1, plen + max_new_tokens + 1), dtype=torch.long, device=device)
    seq[0, :plen] = input_ids[0]
    cache = new_cache(target)
    check_plain_cache(cache, target)

    synchronize(device)
    t0 = time.perf_counter()
    seen = 0 if merge_prefill else plen - 1
    if seen:
        forward_logits(target, seq[:, :seen], cache, 1)
    drafter.start(seq, seen)
    synchronize(device)
    result = GenerationResult([], plen, 0.0, time.perf_counter() - t0)
    length, done = plen, False
    while not done:
        t_iter = time.perf_counter()
        d_sw, v_sw, r_sw = Stopwatch(device), Stopwatch(device), Stopwatch(device)
        generated = length - plen
        with d_sw:
            tree = drafter.propose_tree(seq, length, sampling, generator, max_new_tokens - generated - 1)
        with v_sw:
            logits = verify_tree(target, cache, seq, seen, length, tree)
            if sampling.do_sample:
                path, token = walk_sample(tree, logits_to_probs(logits, sampling), rule, generator)
            else:
                path, token = walk_greedy(tree, logits.argmax(dim=-1).tolist())
        pending = length - seen
        with r_sw:
            new = [tree.tokens_h[i] for i in path] + [token]
            hit = next((i for i, t in enumerate(new) if t in eos), None)
            keep = min(len(new) if hit is None else hit + 1, max_new_tokens - generated)
            seq[0, length: length + len(new)] = torch.tensor(new, device=device)
            # The pass appended the pending tokens (the cache now holds ``length``) and then node i at length + i.
            keep_path(cache, length, [length + i for i in path])
            drafter.keep(path)
        widths = list(drafter.last_widths)
        result.iterations.append(IterationStats(
            k=tree.max_depth, accepted=len(path), bonus=bool(path) and not tree.children(path[-1]),
            new_tokens=keep, draft_s=d_sw.seconds, verify_s=v_sw.seconds, rollback_s=r_sw.seconds,
            total_s=time.perf_counter() - t_iter, length=length, draft_fed=widths[0] if widths else 0,
            draft_calls=len(widths), target_fed=pending + tree.n, with_prompt=seen < length - 1,
            tree_nodes=tree.n, draft_widths=widths))
        result.tokens += new[:keep]
        seen, length = length + len(path), length + len(path) + 1
        done = keep < len(new) or hit is not None or len(result.tokens) >= max_new_tokens
    synchronize(device)
    result.wall_s = time.perf_counter() - t0
    return result
