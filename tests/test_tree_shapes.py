"""The shapes tree drafters propose, the tree attention mask, and the refusal of bad tree configurations."""
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from speclab.decoding.cache import forward_logits, new_cache
from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import GREEDY, SamplingConfig
from speclab.trees.tree import Tree, additive_mask, attention_rows, check_tree_model, point_masses, walk_sample
from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.trees.multi_candidate import accept_candidates

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


def test_tree_refuses_a_token_count_unlike_its_parents():
    """A tree with more (or fewer) tokens than parents, or 2-D tokens, is refused naming both counts."""
    with pytest.raises(ValueError, match=r"^a tree needs one parent per token: \(3,\) tokens, 2 parents$"):
        Tree(torch.tensor([1, 2, 3]), [-1, 0])
    with pytest.raises(ValueError, match=r"^a tree needs one parent per token: \(2, 1\) tokens, 2 parents$"):
        Tree(torch.tensor([[1], [2]]), [-1, 0])


def test_tree_refuses_parents_outside_root_and_earlier_nodes():
    """Parent -1 (the root) or an earlier node only: -2 and a node's own index are refused by name."""
    allowed = "is not allowed: use -1 \\(the root\\) or an earlier node$"
    with pytest.raises(ValueError, match="^parent -2 of node 0 " + allowed):
        Tree(torch.tensor([1]), [-2])
    with pytest.raises(ValueError, match="^parent 1 of node 1 " + allowed):
        Tree(torch.tensor([1, 2]), [-1, 1])
    assert Tree(torch.tensor([1, 2]), [-1, 0]).depth == [1, 2]  # the bounds themselves are fine


def test_empty_tree_holds_long_ids_on_the_sequence_device():
    """An empty tree's tokens are token ids (long) on the given device, so they join a sequence unchanged."""
    tree = Tree.empty(torch.device("cpu"))
    assert tree.n == 0 and tree.tokens.shape == (0,) and tree.tokens.dtype == torch.long
    # A float empty tensor would promote the joined ids to float (no longer valid input ids).
    assert torch.cat([torch.tensor([5, 9]), tree.tokens]).dtype == torch.long
    # A fake CUDA device stands in for a GPU (meta cannot: the tree reads its tokens back to the host).
    with FakeTensorMode():
        fake = Tree.empty(torch.device("cuda"))
    assert fake.n == 0 and fake.tokens.device.type == "cuda" and fake.tokens.dtype == torch.long


def test_chain_keeps_its_draws_for_the_sampling_walk():
    """Tree.chain keeps the rows its proposals were drawn from; the walk accepts by them, not by point masses."""
    x = torch.tensor([3])
    q = torch.tensor([[0.5, 0.0, 0.0, 0.5]])
    chain = Tree.chain(x, q)
    assert chain.draws is q and chain.parents == [-1]
    # p(3) = q(3): the exact rule accepts always; as a point mass (q(3) = 1) only half the time.
    p = torch.tensor([[0.5, 0.0, 0.0, 0.5], [0.25] * 4])
    accepted = [len(walk_sample(chain, p, accept_candidates, torch.Generator().manual_seed(s))[0]) for s in range(20)]
    assert accepted == [1] * 20


def test_additive_mask_dtype_values_and_device():
    """The 4-D additive mask is 0 where allowed and the dtype's minimum elsewhere, in that dtype, on that device."""
    allow = torch.tensor([[True, False], [True, True]])
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        mask = additive_mask(allow, dtype, torch.device("cpu"))
        low = torch.finfo(dtype).min
        assert mask.dtype == dtype and mask.shape == (1, 1, 2, 2)
        assert mask[0, 0].tolist() == [[0.0, low], [0.0, 0.0]]
    # meta stands in for a GPU: a mask left on the CPU would not reach the model's device.
    meta = additive_mask(allow, torch.float16, torch.device("meta"))
    assert meta.device.type == "meta" and meta.dtype == torch.float16 and meta.shape == (1, 1, 2, 2)


def test_point_masses_rows_and_device():
    """Deterministic candidates become one-hot rows over the vocabulary, on the candidates' device."""
    rows = point_masses(torch.tensor([2, 0]), 4)
    assert rows.tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    meta = point_masses(torch.tensor([2, 0]).to("meta"), 4)
    assert meta.device.type == "meta" and meta.shape == (2, 4)


def test_walk_sample_compares_draws_in_the_targets_precision():
    """With a bfloat16 target, a candidate whose residual mass is zero in bfloat16 is never accepted."""
    # Node 0 (token 0, p = 0) is always rejected; its draw row equals p at token 1 once rounded to bfloat16
    # (0.3 -> 0.30078125), so the residual keeps token 2 only and node 1 (token 1) is always rejected.
    # Compared in float32 a rounding sliver at token 1 would take almost all of the residual.
    draws = torch.tensor([[0.001, 0.3, 0.0, 0.699], [0.0, 1.0, 0.0, 0.0]])
    tree = Tree(torch.tensor([0, 1]), [-1, -1], draws)
    p = torch.tensor([[0.0, 0.3, 2.0 ** -20, 0.695], [0.25] * 4, [0.25] * 4]).to(torch.bfloat16)
    for seed in range(5):
        assert walk_sample(tree, p, accept_candidates, torch.Generator().manual_seed(seed)) == ([], 2)


class _PositionsLM(torch.nn.Module):
    """A causal LM stand-in whose forward takes a 4-D mask and position ids."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                logits_to_keep=0):
        raise AssertionError("check_tree_model must not run the model")


class _AlibiLM(_PositionsLM):
    def __init__(self):
        super().__init__()
        self.config = {"model_type": "bloom"}


class _FlashLM(_PositionsLM):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(model_type="llama", _attn_implementation="flash_attention_2")


def test_check_tree_model_refuses_alibi_config():
    """An ALiBi config is refused with its class, its architecture and the chain drafters to use instead."""
    with pytest.raises(ValueError) as excinfo:
        check_tree_model(_AlibiLM())
    assert str(excinfo.value) == (
        "_AlibiLM (bloom) adds ALiBi position biases built from a 2-D attention mask and takes no 4-D tree mask: "
        "it cannot verify a tree; use a chain (drafter model, prompt_lookup or hybrid)")


def test_check_tree_model_names_the_model_class_of_a_bad_attention():
    """A non-tree attention implementation is refused naming it, the model's class and the allowed ones."""
    with pytest.raises(ValueError) as excinfo:
        check_tree_model(_FlashLM())
    assert str(excinfo.value) == ("attention implementation 'flash_attention_2' of _FlashLM cannot verify a tree "
                                  "(it takes no custom 4D mask): allowed are ['sdpa', 'eager']")


def test_check_tree_model_defaults_to_eager_attention():
    """No attention implementation in the config (absent or None), or no config at all, means eager: accepted."""
    for config in (SimpleNamespace(model_type="llama"), SimpleNamespace(model_type="llama", _attn_implementation=None),
                   {"model_type": "llama"}):
        model = _PositionsLM()
        model.config = config
        assert check_tree_model(model) is None
    assert check_tree_model(_PositionsLM()) is None
    for impl in ("sdpa", "eager"):
        model = _PositionsLM()
        model.config = SimpleNamespace(model_type="llama", _attn_implementation=impl)
        assert check_tree_model(model) is None


class _NoPositionsLM(torch.nn.Module):
    """A model with no config whose forward takes no position ids."""

    def forward(self, input_ids, attention_mask=None):
        raise AssertionError("check_tree_model must not run the model")


def test_check_tree_model_refuses_a_forward_without_position_ids_even_without_a_config():
    """Siblings share a position only through position ids: a forward without them is refused, config or not."""
    with pytest.raises(ValueError) as excinfo:
        check_tree_model(_NoPositionsLM())
    assert str(excinfo.value) == (
        "_NoPositionsLM (?) takes no position_ids, so a tree's siblings cannot share a position: it cannot verify "
        "a tree; use a chain (drafter model, prompt_lookup or hybrid)")
