"""Tree drafters: a static shape, a dynamic tree grown from the draft's own probabilities, prompt-lookup trees.

A tree drafter proposes one ``Tree`` per iteration for one sequence (batch 1) and afterwards keeps what the
target accepted. A draft model's tree is grown one depth per forward call: the call that catches up on
the context gives the root's children, and each later call feeds one level of nodes (each seeing the
context, its ancestors and itself) and gives their children. After acceptance its cache keeps the
accepted path's nodes it has run (a gather, as the target's), so the next call feeds only the rest.
"""
from __future__ import annotations

from typing import Protocol

import torch

from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.drafters import lookup_hits
from speclab.decoding.sampling import SamplingConfig, logits_to_probs
from speclab.trees.tree import Tree, attention_rows, check_tree_model, root_path, tree_forward
from speclab.trees.path_cache import check_plain_cache, keep_path
from speclab.trees.multi_candidate import without_replacement_rows


class TreeDrafter(Protocol):
    """What ``speclab.trees.tree_loop`` drives. ``last_widths``: the draft model's forward-call widths in the
    last ``propose_tree`` (empty without a model): the time model prices a tree's drafting from them."""

    last_widths: list[int]

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        """Begin a sequence; ``ids[0, :n_ctx]`` may be pre-processed (prefill)."""

    def propose_tree(self, ids: torch.Tensor, length: int, sampling: SamplingConfig,
                     generator: torch.Generator | None, max_depth: int) -> Tree:
        """A tree continuing ``ids[0, :length]``, no deeper than ``max_depth`` (0: the empty tree)."""

    def keep(self, path: list[int]) -> None:
        """The target accepted these nodes of the last tree (a root path, maybe empty)."""


class _ModelTree:
    """The draft-model half of a tree drafter: its cache and the level-by-level tree passes."""

    def __init__(self, model: torch.nn.Module) -> None:
        check_tree_model(model)
        self.model = model
        self.cache = None
        self.seen = 0  # context tokens in the cache
        self.last_widths: list[int] = []
        self._ctx = 0  # the context length of the current tree
        self._fed = 0  # tree-node columns after the context, this iteration
        self._cols: dict[object, int] = {}  # a node's key -> its cache column

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self.cache = new_cache(self.model)
        check_plain_cache(self.cache, self.model)
        if n_ctx:
            forward_logits(self.model, ids[:, :n_ctx], self.cache, 1)
        self.seen, self._cols, self.last_widths = n_ctx, {}, []

    def root_logits(self, ids: torch.Tensor, length: int) -> torch.Tensor:
        """Catch up on the context (every token not yet run); the logits after it [V]."""
        pending = ids[:, self.seen: length]
        logits = forward_logits(self.model, pending, self.cache, 1)[-1]
        self._ctx, self._fed, self._cols, self.seen = length, 0, {}, length
        self.last_widths = [pending.shape[1]]
        return logits

    def level_logits(self, keys: list[object], tokens: torch.Tensor, ancestors: list[list[object]],
                     depths: list[int]) -> torch.Tensor:
        """Feed one level of nodes (``ancestors[j]``: the keys of node j's fed ancestors); their logits [r, V]."""
        allow = attention_rows(self._ctx, self._fed, [[self._cols[a] for a in anc] for anc in ancestors], 0)
        logits = tree_forward(self.model, self.cache, tokens, allow, [self._ctx - 1 + d for d in depths], len(keys))
        for j, key in enumerate(keys):
            self._cols[key] = self._ctx + self._fed + j
        self._fed += len(keys)
        self.last_widths.append(len(keys))
        return logits

    def keep_nodes(self, keys: list[object]) -> None:
        """Keep the accepted path's leading nodes that were run (``keys`` in path order)."""
        if not self.last_widths:
            return  # nothing ran this iteration
        slots = []
        for key in keys:
            if key not in self._cols:
                break
            slots.append(self._cols[key])
        keep_path(self.cache, self._ctx, slots)
        self.seen = self._ctx + len(slots)
        self._cols = {}


class _DraftModelTree:
    """What the tree drafters that run a draft model share: the model, its cache, the call widths."""

    draft: _ModelTree

    @property
    def model(self) -> torch.nn.Module:
        return self.draft.model

    @property
    def last_widths(self) -> list[int]:
        return self.draft.last_widths

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        self.draft.start(ids, n_ctx)


def _scores(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The draft's distribution a tree is grown from: the sampled one, or the softmax under greedy."""
    if sampling.do_sample:
        return logits_to_probs(logits, sampling)
    return torch.softmax(logits.float(), dim=-1)


class StaticTreeDrafter(_DraftModelTree):
    """A draft model's tree of a fixed shape: ``branching[d]`` children for every node at depth d
    (``[3, 2, 1, 1]``: 3 + 6 + 6 + 6 = 21 nodes, depth 4; ``[1] * k`` is a chain of k).

    Greedy: each node's children are the draft's top-b tokens. Sampling: they are drawn from the draft's
    distribution without replacement (fewer where it has fewer tokens with mass), and the tree records the
    distribution each was drawn from for the multi-candidate rule."""

    def __init__(self, model: torch.nn.Module, branching: list[int] | tuple[int, ...] = (3, 2, 1, 1)) -> None:
        shape = list(branching)
        if not shape or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in shape):
            raise ValueError(f"branching={shape} is not allowed: use a non-empty list of integers >= 1 (children "
                             "per node at each depth)")
        self.branching = shape
        self.draft = _ModelTree(model)

    def propose_tree(self, ids: torch.Tensor, length: int, sampling: SamplingConfig,
                     generator: torch.Generator | None, max_depth: int) -> Tree:
        shape = self.branching[:max_depth]
        self.draft.last_widths = []
        if not shape:
            return Tree.empty(ids.device)
        logits = self.draft.root_logits(ids, length)[None]
        tokens: list[torch.Tensor] = []
        parents: list[int] = []
        draws: list[torch.Tensor] = []
        level: list[int] = [-1]
        for d, b in enumerate(shape):
            if d:
                logits = self.draft.level_logits(level, torch.cat(tokens)[level], [root_path(parents, n)[:-1]
                                                                                  for n in level], [d] * len(level))
            q = _scores(logits, sampling)
            if sampling.do_sample:
                b = min(b, int((q > 0).sum(dim=-1).min()))
                x = torch.multinomial(q, b, replacement=False, generator=generator)
                draws += [without_replacement_rows(q[r], x[r]) for r in range(len(level))]
            else:
                x = torch.topk(logits, b, dim=-1).indices
            start = len(parents)
            tokens.append(x.flatten())
            parents += [node for node in level for _ in range(b)]
            level = list(range(start, len(parents)))
        return Tree(torch.cat(tokens), parents, torch.cat(draws) if draws else None)

    def keep(self, path: list[int]) -> None:
        self.draft.keep_nodes(path)


class DynamicTreeDrafter(_DraftModelTree):
    """EAGLE-2's dynamic tree: grown from the draft's own probabilities within a node budget.

    Each depth expands the ``topk`` nodes of the last level with the highest path probability (the
    product of the draft's probabilities along the path) by their ``topk`` most probable children; after
    ``depth`` levels the tree keeps the ``nodes`` candidates of highest path probability (a child is never
    more probable than its parent, so the kept set is a tree). Children are chosen deterministically, so
    under sampling each is checked as a point mass."""

    def __init__(self, model: torch.nn.Module, depth: int = 5, topk: int = 4, nodes: int = 16) -> None:
        for name, value in (("depth", depth), ("topk", topk), ("nodes", nodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is not allowed: use an integer >= 1")
        self.depth, self.topk, self.nodes = depth, topk, nodes
        self.draft = _ModelTree(model)
        self._keys: list[int] = []

    def propose_tree(self, ids: torch.Tensor, length: int, sampling: SamplingConfig,
                     generator: torch.Generator | None, max_depth: int) -> Tree:
        depth = min(self.depth, max_depth)
        self.draft.last_widths = []
        if not depth:
            return Tree.empty(ids.device)
        logits = self.draft.root_logits(ids, length)[None]
        tok: list[int] = []
        parent: list[int] = []
        score: list[float] = []
        level_of: list[int] = []
        frontier: list[int] = [-1]
        for d in range(1, depth + 1):
            if d > 1:
                logits = self.draft.level_logits(
                    frontier, torch.tensor([tok[n] for n in frontier], device=ids.device),
                    [root_path(parent, n)[:-1] for n in frontier], [d - 1] * len(frontier))
            q = _scores(logits, sampling)
            top = torch.topk(q, min(self.topk, q.shape[-1]), dim=-1)
            logq = top.values.clamp_min(torch.finfo(torch.float32).tiny).log().tolist()
            new = []
            for r, node in enumerate(frontier):
                base = 0.0 if node < 0 else score[node]
                for t, lq, v in zip(top.indices[r].tolist(), logq[r], top.values[r].tolist()):
                    if v <= 0:
                        continue  # no mass under the sampling transforms: never worth a slot
                    tok.append(t)
                    parent.append(node)
                    score.append(base + lq)
                    level_of.append(d)
                    new.append(len(tok) - 1)
            frontier = sorted(new, key=lambda n: (-score[n], n))[: self.topk]
            if not frontier:
                break
        kept = sorted(sorted(range(len(tok)), key=lambda n: (-score[n], level_of[n], n))[: self.nodes],
                      key=lambda n: (level_of[n], n))
        index = {n: i for i, n in enumerate(kept)}
        self._keys = kept
        return Tree(torch.tensor([tok[n] for n in kept], dtype=torch.long, device=ids.device),
                    [index[parent[n]] if parent[n] >= 0 else -1 for n in kept])

    def keep(self, path: list[int]) -> None:
        self.draft.keep_nodes([self._keys[i] for i in path])


class LookupTreeDrafter:
    """Prompt-lookup trees: the tokens that followed each of the ``branches`` most recent earlier
    occurrences of the final n-gram (longest n from ``max_ngram`` down to ``min_ngram`` with a match),
    each up to ``depth`` tokens, merged into a trie (shared prefixes become one path; the most recent
    occurrence's continuation is the first child). No model, no cost; deterministic candidates."""

    last_widths: list[int] = []

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, branches: int = 4, depth: int = 6) -> None:
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("branches", branches),
                            ("depth", depth)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is not allowed: use an integer >= 1")
        if min_ngram > max_ngram:
            raise ValueError(f"n-gram sizes min={min_ngram}, max={max_ngram} are not allowed: need 1 <= min <= max")
        self.max_ngram, self.min_ngram, self.branches, self.depth = max_ngram, min_ngram, branches, depth

    def start(self, ids: torch.Tensor, n_ctx: int) -> None:
        pass

    def matches(self, seq: torch.Tensor) -> list[int]:
        """Where the continuations of the longest matched final n-gram start, most recent first."""
        n, hits = lookup_hits(seq, self.max_ngram, self.min_ngram)
        return [int(h) + n for h in hits.flip(0)[: self.branches]]

    def propose_tree(self, ids: torch.Tensor, length: int, sampling: SamplingConfig,
                     generator: torch.Generator | None, max_depth: int) -> Tree:
        depth = min(self.depth, max_depth)
        seq = ids[0, :length]
        if not depth:
            return Tree.empty(ids.device)
        host = seq.tolist()
        tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}
        for start in self.matches(seq):
            at = -1
            for t in host[start: start + depth]:
                if (at, t) not in child:
                    tokens.append(t)
                    parents.append(at)
                    child[(at, t)] = len(tokens) - 1
                at = child[(at, t)]
        return Tree(torch.tensor(tokens, dtype=torch.long, device=ids.device), parents)

    def keep(self, path: list[int]) -> None:
        pass

