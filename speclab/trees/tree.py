"""A tree of proposals, the attention mask that verifies it in one pass, and the walks that accept a root path.

A tree's nodes are proposals in topological order (a node's parent comes before it); parent -1 is the
root, the last token of the context, whose children are candidates for the next position. Node i sits
at depth ``depth[i]`` (1 for the root's children) and so at position context length - 1 + depth: each
node attends to the context, its ancestors and itself, and to nothing else (EAGLE, Medusa, SpecInfer).
A chain of k proposals is the tree whose node i has parent i - 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speclab.decoding.checks import shown
from speclab.trees.support import tree_mask_problem


@dataclass
class Tree:
    """Proposals as a tree. ``draws`` [n, V]: under sampling, the distribution node i was drawn from
    given its earlier siblings (the multi-candidate rule needs it); None: the children were chosen
    deterministically (top-b, prompt lookup), each a point mass."""

    tokens: torch.Tensor  # [n] token ids, on the device of the sequence
    parents: list[int]
    draws: torch.Tensor | None = None
    depth: list[int] = field(init=False)
    tokens_h: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.tokens.shape[0] != len(self.parents):
            raise ValueError(f"a tree needs one parent per token: {tuple(self.tokens.shape)} tokens, "
                             f"{len(self.parents)} parents")
        self.depth = []
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"parent {p} of node {i} is not allowed: use -1 (the root) or an earlier node")
            self.depth.append(1 if p < 0 else self.depth[p] + 1)
        self.tokens_h = self.tokens.tolist()
        self._children: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            self._children.setdefault(p, []).append(i)

    @property
    def n(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (-1: the root) in order."""
        return self._children.get(node, [])

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``."""
        return root_path(self.parents, node)

    @staticmethod
    def empty(device: torch.device) -> "Tree":
        return Tree(torch.empty(0, dtype=torch.long, device=device), [])

    @staticmethod
    def chain(tokens: torch.Tensor, draws: torch.Tensor | None = None) -> "Tree":
        return Tree(tokens, list(range(-1, tokens.shape[0] - 1)), draws)


def root_path(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node`` in a parent list (-1: the root), e.g. while a tree grows."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def attention_rows(base: int, fed_before: int, parents_cols: list[list[int]], pending: int) -> torch.Tensor:
    """Which cache columns each new query sees, [pending + nodes, base + fed_before + pending + nodes] (bool).

    The cache holds ``base`` context columns, then ``fed_before`` columns of tree nodes fed by earlier
    calls; this call feeds ``pending`` context tokens (causal among themselves) and then one query per
    node, whose ``parents_cols[j]`` lists its ancestors' columns (earlier calls' or this call's).
    """
    n = len(parents_cols)
    start = base + fed_before
    total = start + pending + n
    allow = torch.zeros(pending + n, total, dtype=torch.bool)
    for i in range(pending):
        allow[i, : start + i + 1] = True
    for j, cols in enumerate(parents_cols):
        allow[pending + j, : base] = True
        allow[pending + j, start: start + pending] = True
        allow[pending + j, cols] = True
        allow[pending + j, start + pending + j] = True
    return allow


def tree_inputs(tree: Tree, seen: int, length: int) -> tuple[torch.Tensor, list[int]]:
    """Visibility and position ids of one verification pass over a cache of ``seen`` tokens: the pending
    context tokens ``seen..length-1`` (causal), then every node (context, ancestors, itself) at length - 1 + depth."""
    pending = length - seen
    allow = attention_rows(seen, 0, [[seen + pending + a for a in tree.path(j)[:-1]] for j in range(tree.n)], pending)
    return allow, list(range(seen, length)) + [length - 1 + d for d in tree.depth]


def additive_mask(allow: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A bool visibility matrix as the 4D additive mask [1, 1, q, kv] transformers takes with position ids."""
    mask = torch.zeros(allow.shape, dtype=dtype)
    mask.masked_fill_(~allow, torch.finfo(dtype).min)
    return mask[None, None].to(device)


TREE_ATTENTION = ("sdpa", "eager")


def check_tree_model(model: torch.nn.Module) -> None:
    """A tree pass needs an attention path that takes a custom 4D mask with explicit position ids: not ALiBi
    (Bloom, MPT), not a forward without position ids (``speclab.trees.support``)."""
    config = getattr(model, "config", None)
    problem = tree_mask_problem(type(model), config)  # a model without a config still needs position ids
    if problem:
        raise ValueError(f"{problem}: it cannot verify a tree; use a chain (drafter model, prompt_lookup or hybrid)")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in TREE_ATTENTION:
        raise ValueError(f"attention implementation {shown(impl)} of {type(model).__name__} cannot verify a tree "
                         f"(it takes no custom 4D mask): allowed are {list(TREE_ATTENTION)}")


@torch.inference_mode()
def tree_forward(model: torch.nn.Module, cache: object, tokens: torch.Tensor, allow: torch.Tensor,
                 positions: list[int], n_logits: int) -> torch.Tensor:
    """Run ``tokens`` [r] on top of ``cache`` with visibility ``allow`` [r, cache + r] and these position ids;
    logits of the last ``n_logits`` queries [n_logits, V]."""
    device = tokens.device
    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    mask = additive_mask(allow, dtype, device)
    pos = torch.tensor([positions], dtype=torch.long, device=device)
    out = model(input_ids=tokens[None], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                logits_to_keep=n_logits)
    return out.logits[0]


def walk_greedy(tree: Tree, best: list[int]) -> tuple[list[int], int]:
    """The longest root path whose every token is the target's arg-max at its parent, and the target's
    token after it. ``best[0]``: the arg-max at the root, ``best[1 + i]`` at node i."""
    path, at = [], -1
    while True:
        token = best[at + 1]
        nxt = next((c for c in tree.children(at) if tree.tokens_h[c] == token), None)
        if nxt is None:
            return path, token
        path.append(nxt)
        at = nxt


def point_masses(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """One-hot rows [m, V]: the distributions of deterministically chosen candidates."""
    return torch.zeros(tokens.shape[0], vocab, device=tokens.device).scatter_(1, tokens[:, None], 1.0)


def walk_sample(tree: Tree, p: torch.Tensor, rule, generator: torch.Generator | None) -> tuple[list[int], int]:
    """Sampling: at each node from the root down, the multi-candidate ``rule`` either accepts one child
    (the walk moves to it) or emits a token from the residual; at a leaf the target's own row supplies it.
    ``p`` [n + 1, V]: the target's processed distributions at the root (row 0) and at each node."""
    path, at = [], -1
    while True:
        kids = tree.children(at)
        row = p[at + 1]
        if not kids:
            return path, int(torch.multinomial(row, 1, generator=generator))
        cand = tree.tokens[kids]
        q = tree.draws[kids] if tree.draws is not None else point_masses(cand, row.shape[0])
        i, token = rule(cand, row, q.to(row.dtype), generator)
        if i < 0:
            return path, token
        path.append(kids[i])
        at = kids[i]
