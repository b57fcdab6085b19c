"""What a tree loop measures, checked against an independent count.

A greedy walk that looks at fewer children than it should (only each node's first, say) still emits exactly plain
greedy's tokens, so the output tests pass, while every tree's acceptance, tokens per pass and speed-up drop: a defect
of a measuring tool. Here the accepted length of every walk and of every iteration of the loop is recomputed by
brute force: the longest root path whose tokens are the target's arg-max at each parent (the walk), or the next
tokens of plain greedy's output (the loop), searched over every node of the tree.
"""
import pytest
import torch

from speclab.tree import Tree, walk_greedy
from speclab.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.tree_loop import tree_generate
from test_tree_greedy import LOOKUP_PROMPTS, N_NEW, arch, recording  # noqa: F401  (arch: the fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def longest_matching_path(tree: Tree, wanted) -> list[int]:
    """Brute force: of every node whose root path's tokens are ``wanted(path so far)`` at each step, the deepest
    (the first in node order among equals); [] when no child of the root matches."""
    best: list[int] = []
    for node in range(tree.n):
        path = tree.path(node)
        if all(tree.tokens_h[n] == wanted(path[:i]) for i, n in enumerate(path)) and len(path) > len(best):
            best = path
    return best


def distinct_sibling_tree(g: torch.Generator, n: int, vocab: int) -> Tree:
    """A random tree whose siblings carry distinct tokens (as every drafter's trees do)."""
    parents, tokens, used = [], [], {}
    for i in range(n):
        p = -1 if i == 0 else int(torch.randint(-1, i, (1,), generator=g))
        free = [t for t in range(vocab) if t not in used.get(p, set())]
        if not free:
            p, free = i - 1, list(range(vocab))  # a full parent: hang the node under the previous one
        t = free[int(torch.randint(0, len(free), (1,), generator=g))]
        used.setdefault(p, set()).add(t)
        parents.append(p)
        tokens.append(t)
    return Tree(torch.tensor(tokens), parents)


def test_with_distinct_siblings_the_walk_is_the_brute_force_longest_path():
    g = torch.Generator().manual_seed(5)
    left_first_child = 0
    for _ in range(3000):
        vocab = int(torch.randint(2, 5, (1,), generator=g))
        tree = distinct_sibling_tree(g, int(torch.randint(1, 12, (1,), generator=g)), vocab)
        best = torch.randint(0, vocab, (tree.n + 1,), generator=g).tolist()
        path, _ = walk_greedy(tree, best)
        brute = longest_matching_path(tree, lambda above: best[above[-1] + 1 if above else 0])
        assert path == brute, (tree.parents, tree.tokens_h, best)
        left_first_child += any(n != tree.children(tree.parents[n])[0] for n in path)
    assert left_first_child > 100


MAKERS = {
    "static-3211": lambda d: StaticTreeDrafter(d, [3, 2, 1, 1]),
    "dynamic": lambda d: DynamicTreeDrafter(d, depth=4, topk=3, nodes=10),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_every_iteration_accepts_the_longest_root_path_that_continues_plain_greedy(arch, kind):
    """The loop's accepted counts (what acceptance, tokens per pass and the speed-up are made of) against the
    brute-force longest root path of each proposed tree that matches plain greedy's next tokens."""
    name, target, draft, prompts, plain = arch
    off_first_child = 0
    for p, expected in zip(prompts, plain):
        drafter = MAKERS[kind](draft)
        log = recording(drafter)
        res = tree_generate(target, drafter, p[None], N_NEW)
        at = 0  # output tokens before the iteration
        for it, tree in zip(res.iterations, log["trees"]):
            brute = longest_matching_path(tree, lambda above: expected[at + len(above)]
                                          if at + len(above) < len(expected) else -1)
            assert it.accepted == len(brute), f"{name} {kind}: iteration at output {at} accepted {it.accepted}, " \
                                              f"brute force {len(brute)}"
            off_first_child += any(n != tree.children(tree.parents[n])[0] for n in brute)
            at += it.new_tokens
    assert off_first_child > 0, f"{name} {kind}: no accepted path left a first child: the check could not fail"


def test_lookup_tree_iterations_accept_the_brute_force_longest_path(arch):
    name, target, _, _, _ = arch
    from speclab.loop import plain_greedy

    for tokens in LOOKUP_PROMPTS:
        ids = torch.tensor([tokens])
        expected = plain_greedy(target, ids, 40).tokens
        drafter = LookupTreeDrafter(max_ngram=3, min_ngram=1, branches=4, depth=5)
        log = recording(drafter)
        res = tree_generate(target, drafter, ids, 40)
        at = 0
        for it, tree in zip(res.iterations, log["trees"]):
            brute = longest_matching_path(tree, lambda above: expected[at + len(above)]
                                          if at + len(above) < len(expected) else -1)
            assert it.accepted == len(brute), f"{name} lookup: iteration at output {at}"
            at += it.new_tokens
