"""The shapes tree drafters propose, the tree attention mask, and the refusal of bad tree configurations."""
import pytest
import torch

from speclab.cache import forward_logits, new_cache
from speclab.models import tiny_random_model
from speclab.sampling import GREEDY, SamplingConfig
from speclab.tree import Tree, attention_rows
from speclab.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 64
CONTEXT = [5, 9, 4, 1, 7, 33]


@pytest.fixture(scope="module")
def draft():
    return tiny_random_model(V, seed=1)


def _ids(tokens, room=8):
    return torch.tensor([tokens + [0] * room])


def _draft_logits(model, tokens):
    return forward_logits(model, torch.tensor([tokens]), new_cache(model), 1)[-1]


def test_attention_rows_with_pending_context():
    # 3 cached context columns, 2 pending context tokens, then nodes 0 (depth 1), 1 (child of 0), 2 (depth 1).
    allow = attention_rows(3, 0, [[], [5], []], 2)
    want = torch.tensor([
        [1, 1, 1, 1, 0, 0, 0, 0],  # pending token 0 (column 3): causal
        [1, 1, 1, 1, 1, 0, 0, 0],  # pending token 1 (column 4)
        [1, 1, 1, 1, 1, 1, 0, 0],  # node 0: the context and itself
        [1, 1, 1, 1, 1, 1, 1, 0],  # node 1: the context, node 0 and itself
        [1, 1, 1, 1, 1, 0, 0, 1],  # node 2: the context and itself, not its earlier siblings' subtree
    ], dtype=torch.bool)
    assert allow.dtype == torch.bool and torch.equal(allow, want)


def test_attention_rows_over_earlier_levels():
    # A draft's level call: 2 context columns, 3 nodes fed earlier (columns 2, 3, 4), now 2 nodes whose
    # ancestors are columns [2] and [3, 4].
    allow = attention_rows(2, 3, [[2], [3, 4]], 0)
    want = torch.tensor([
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(allow, want)


def test_tree_paths_and_children():
    tree = Tree(torch.tensor([4, 5, 6, 7, 8]), [-1, -1, 0, 1, 2])
    assert tree.depth == [1, 1, 2, 2, 3] and tree.max_depth == 3 and tree.n == 5
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2] and tree.children(4) == []
    assert tree.path(4) == [0, 2, 4] and tree.path(3) == [1, 3]
    chain = Tree.chain(torch.tensor([1, 2, 3]))
    assert chain.parents == [-1, 0, 1] and chain.max_depth == 3
    assert Tree.empty(torch.device("cpu")).n == 0
    with pytest.raises(ValueError, match="parent 2 of node 1"):
        Tree(torch.tensor([1, 2]), [-1, 2])


STATIC_PARENTS = [-1] * 3 + [0, 0, 1, 1, 2, 2] + list(range(3, 9)) + list(range(9, 15))


@pytest.mark.parametrize("n_ctx", [0, 4])
def test_static_tree_shape(draft, n_ctx):
    drafter = StaticTreeDrafter(draft, [3, 2, 1, 1])
    ids = _ids(CONTEXT)
    drafter.start(ids, n_ctx)
    tree = drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 10)
    assert tree.n == 21 and tree.draws is None
    assert [tree.depth.count(d) for d in (1, 2, 3, 4)] == [3, 6, 6, 6]
    assert tree.parents == STATIC_PARENTS
    # One catch-up call, then one call per level that has children.
    assert drafter.last_widths == [len(CONTEXT) - n_ctx, 3, 6, 6]
    # Greedy children are the draft's top-b after each node's root path.
    for node in (-1, 0, 1, 2, 4, 7, 12):
        prefix = CONTEXT + [tree.tokens_h[a] for a in (tree.path(node) if node >= 0 else [])]
        b = len(tree.children(node))
        top = torch.topk(_draft_logits(draft, prefix), b).indices.tolist()
        assert [tree.tokens_h[c] for c in tree.children(node)] == top, f"children of node {node}"


def test_static_tree_max_depth_cuts_it(draft):
    drafter = StaticTreeDrafter(draft, [3, 2, 1, 1])
    ids = _ids(CONTEXT)
    drafter.start(ids, 0)
    tree = drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 2)
    assert tree.n == 9 and tree.parents == STATIC_PARENTS[:9] and tree.max_depth == 2
    assert drafter.last_widths == [len(CONTEXT), 3]
    assert drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 0).n == 0
    assert drafter.last_widths == []


def test_static_tree_sampled_children_are_distinct(draft):
    drafter = StaticTreeDrafter(draft, [4, 3])
    ids = _ids(CONTEXT)
    g = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(do_sample=True, temperature=2.0)
    for _ in range(5):
        drafter.start(ids, 0)
        tree = drafter.propose_tree(ids, len(CONTEXT), cfg, g, 10)
        assert tree.n == 4 + 12 and tree.draws.shape == (16, V)
        for node in range(-1, tree.n):
            kids = [tree.tokens_h[c] for c in tree.children(node)]
            assert len(set(kids)) == len(kids)
        assert torch.allclose(tree.draws.sum(dim=1), torch.ones(16))


@pytest.fixture(scope="module")
def soft_draft():
    """Spread-out probabilities: path probabilities far from ties."""
    return tiny_random_model(V, seed=1, logit_scale=3.0)


def _reference_dynamic(model, depth, topk):
    """EAGLE-2's candidates by fresh forward passes: {token path: log path probability}."""
    scores, frontier = {}, [()]
    for _ in range(depth):
        new = {}
        for path in frontier:
            logp = torch.log_softmax(_draft_logits(model, CONTEXT + list(path)).double(), -1)
            top = torch.topk(logp, topk)
            for t, lp in zip(top.indices.tolist(), top.values.tolist()):
                new[path + (t,)] = scores.get(path, 0.0) + lp
        scores.update(new)
        frontier = sorted(new, key=lambda k: -new[k])[:topk]
    return scores


@pytest.mark.parametrize("nodes", [1, 4, 10, 30])
def test_dynamic_tree_shape(soft_draft, nodes):
    drafter = DynamicTreeDrafter(soft_draft, depth=4, topk=3, nodes=nodes)
    ids = _ids(CONTEXT)
    drafter.start(ids, 0)
    tree = drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 10)
    assert tree.n == nodes  # 3 + 9 + 9 + 9 = 30 candidates
    assert tree.draws is None
    assert all(p < i for i, p in enumerate(tree.parents))  # every parent kept, before its children
    assert tree.depth == sorted(tree.depth)  # level by level
    assert tree.tokens_h[tree.children(-1)[0]] == int(_draft_logits(soft_draft, CONTEXT).argmax())
    for node in range(-1, tree.n):
        kids = [tree.tokens_h[c] for c in tree.children(node)]
        assert len(set(kids)) == len(kids)
    # The kept nodes are the ``nodes`` candidates of highest path probability.
    scores = _reference_dynamic(soft_draft, 4, 3)
    assert len(scores) == 30
    best = sorted(scores, key=lambda k: -scores[k])[:nodes]
    kept = [tuple(tree.tokens_h[a] for a in tree.path(j)) for j in range(tree.n)]
    assert sorted(kept) == sorted(best)
    if nodes == 30:
        assert [tree.depth.count(d) for d in (1, 2, 3, 4)] == [3, 9, 9, 9]
        assert drafter.last_widths == [len(CONTEXT), 3, 3, 3]


def test_dynamic_tree_max_depth_cuts_it(soft_draft):
    drafter = DynamicTreeDrafter(soft_draft, depth=4, topk=3, nodes=30)
    ids = _ids(CONTEXT)
    drafter.start(ids, 0)
    tree = drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 2)
    assert tree.max_depth == 2 and tree.n == 12
    assert drafter.propose_tree(ids, len(CONTEXT), GREEDY, None, 0).n == 0


# Three earlier occurrences of the final bigram (1, 2): at 0 -> 5 6 9, at 5 -> 5 7 8, at 10 -> 3 4 0.
LOOKUP_SEQ = [1, 2, 5, 6, 9, 1, 2, 5, 7, 8, 1, 2, 3, 4, 0, 1, 2]


def test_lookup_tree_merges_shared_prefixes():
    drafter = LookupTreeDrafter(max_ngram=2, min_ngram=1, branches=4, depth=3)
    ids = _ids(LOOKUP_SEQ)
    tree = drafter.propose_tree(ids, len(LOOKUP_SEQ), GREEDY, None, 10)
    # The most recent occurrence's continuation first; 5 7 8 and 5 6 9 share their first node.
    assert tree.tokens_h == [3, 4, 0, 5, 7, 8, 6, 9]
    assert tree.parents == [-1, 0, 1, -1, 3, 4, 3, 6]
    assert [tree.tokens_h[c] for c in tree.children(-1)] == [3, 5]
    assert [tree.tokens_h[c] for c in tree.children(3)] == [7, 6]
    assert tree.draws is None and drafter.last_widths == []
    # Fewer branches: the two most recent occurrences only; a smaller depth: shorter paths.
    two = LookupTreeDrafter(max_ngram=2, min_ngram=1, branches=2, depth=3).propose_tree(
        ids, len(LOOKUP_SEQ), GREEDY, None, 10)
    assert two.tokens_h == [3, 4, 0, 5, 7, 8] and two.parents == [-1, 0, 1, -1, 3, 4]
    cut = drafter.propose_tree(ids, len(LOOKUP_SEQ), GREEDY, None, 1)
    assert cut.tokens_h == [3, 5] and cut.parents == [-1, -1]
    assert drafter.propose_tree(ids, len(LOOKUP_SEQ), GREEDY, None, 0).n == 0


def test_lookup_tree_prefers_the_longest_ngram():
    # The trigram (0, 1, 2) occurred once (-> 6), the bigram (1, 2) twice more: only the trigram's match counts.
    seq = [0, 1, 2, 6, 1, 2, 7, 1, 2, 8, 0, 1, 2]
    tree = LookupTreeDrafter(max_ngram=3, min_ngram=1, branches=4, depth=2).propose_tree(
        _ids(seq), len(seq), GREEDY, None, 10)
    assert tree.tokens_h == [6, 1] and tree.parents == [-1, 0]
    tree = LookupTreeDrafter(max_ngram=2, min_ngram=1, branches=4, depth=1).propose_tree(
        _ids(seq), len(seq), GREEDY, None, 10)
    assert tree.tokens_h == [8, 7, 6] and tree.parents == [-1, -1, -1]


def test_lookup_tree_without_match_is_empty():
    seq = [1, 2, 3, 4, 5]
    tree = LookupTreeDrafter(max_ngram=3, min_ngram=1).propose_tree(_ids(seq), len(seq), GREEDY, None, 10)
    assert tree.n == 0 and tree.tokens.shape == (0,)
    # min_ngram 2: a single repeated token is not enough.
    seq = [4, 1, 2, 4]
    assert LookupTreeDrafter(max_ngram=3, min_ngram=2).propose_tree(_ids(seq), len(seq), GREEDY, None, 10).n == 0
    assert LookupTreeDrafter(max_ngram=3, min_ngram=1).propose_tree(_ids(seq), len(seq), GREEDY, None, 10).n == 3


@pytest.mark.parametrize("make, words", [
    (lambda m: StaticTreeDrafter(m, []), ["branching=[]"]),
    (lambda m: StaticTreeDrafter(m, [0]), ["branching=[0]"]),
    (lambda m: StaticTreeDrafter(m, [2, True]), ["branching=[2, True]"]),
    (lambda m: StaticTreeDrafter(m, [2, 1.5]), ["branching=[2, 1.5]"]),
    (lambda m: DynamicTreeDrafter(m, depth=0), ["depth=0"]),
    (lambda m: DynamicTreeDrafter(m, topk=True), ["topk=True"]),
    (lambda m: DynamicTreeDrafter(m, nodes=0), ["nodes=0"]),
    (lambda m: DynamicTreeDrafter(m, depth=2.0), ["depth=2.0"]),
    (lambda m: LookupTreeDrafter(max_ngram=2, min_ngram=3), ["min=3", "max=2"]),
    (lambda m: LookupTreeDrafter(min_ngram=0), ["min_ngram=0"]),
    (lambda m: LookupTreeDrafter(depth=0), ["depth=0"]),
    (lambda m: LookupTreeDrafter(branches=True), ["branches=True"]),
])
def test_bad_configurations_are_refused(draft, make, words):
    with pytest.raises(ValueError) as excinfo:
        make(draft)
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
