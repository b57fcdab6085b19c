"""What a tree loop measures, checked against an independent count.

A greedy walk that looks at fewer children than it should (only each node's first, say) still emits exactly plain
greedy's tokens, so the output tests pass, while every tree's acceptance, tokens per pass and speed-up drop: a defect
of a measuring tool. Here the accepted length of every walk and of every iteration of the loop is recomputed by
brute force: the longest root path whose tokens are the target's arg-max at each parent (the walk), or the next
tokens of plain greedy's output (the loop), searched over every node of the tree.
"""
import pytest
import torch

from speclab.trees.tree import Tree, walk_greedy
from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.trees.tree_loop import tree_generate
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
    from speclab.decoding.loop import plain_greedy

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


# --- The proposed trees themselves, against trees recomputed from plain forward passes of the draft model ---

def _next_logits(model, tokens: list[int]) -> torch.Tensor:
    """The draft's logits after ``tokens``: one plain forward pass, no cache, no tree mask."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def _node_contexts(tree: Tree, prompt: list[int]) -> list[list[int]]:
    """The context each node continues: the prompt, then its ancestors' tokens."""
    return [prompt + [tree.tokens_h[a] for a in tree.path(n)[:-1]] for n in range(tree.n)]


def _children_tokens(tree: Tree, node: int) -> list[int]:
    return [tree.tokens_h[c] for c in tree.children(node)]


def test_default_dynamic_tree_is_eagle2s_16_nodes_of_depth_5_grown_4_wide():
    """DynamicTreeDrafter's defaults (depth 5, top-4, 16 nodes): the draft-call widths the time model prices, the
    tree size, and the kept nodes equal the 16 best path probabilities of a brute-force EAGLE-2 expansion."""
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import GREEDY

    model = tiny_random_model(64, seed=3, logit_scale=2.0)
    prompt = [5, 9, 13]
    drafter = DynamicTreeDrafter(model)
    drafter.start(torch.tensor([prompt]), 0)
    tree = drafter.propose_tree(torch.tensor([prompt]), 3, GREEDY, None, 10)
    # The catch-up call over the 3 prompt tokens, then 4 levels of the 4 best nodes each: depth 5.
    assert drafter.last_widths == [3, 4, 4, 4, 4]
    assert tree.n == 16 and tree.max_depth <= 5

    # Brute force in float64: expand the 4 most probable paths of each depth by their 4 most probable children.
    cands: dict[tuple[int, ...], float] = {}
    frontier = [()]
    for _ in range(5):
        new = {}
        for path in frontier:
            p = torch.softmax(_next_logits(model, prompt + list(path)).double(), -1)
            top = torch.topk(p, 4)
            base = cands.get(path, 1.0)
            for t, v in zip(top.indices.tolist(), top.values.tolist()):
                new[path + (t,)] = base * v
        cands.update(new)
        frontier = sorted(new, key=lambda k: -new[k])[:4]
    best = sorted(cands, key=lambda k: -cands[k])
    assert cands[best[15]] > cands[best[16]] * (1 + 1e-4)  # no near-tie at the budget's edge: the set is defined
    proposed = {tuple(tree.tokens_h[a] for a in tree.path(n)) for n in range(tree.n)}
    assert proposed == set(best[:16])


def test_dynamic_tree_under_top_k_sampling_never_spends_a_node_on_a_token_without_mass():
    """Under top-k=2 sampling a child outside the draft's top 2 has probability 0: the dynamic tree proposes only
    tokens the filtered draft can produce (2 children per expanded node), so the node budget is not wasted."""
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import SamplingConfig, logits_to_probs

    model = tiny_random_model(64, seed=4, logit_scale=2.0)
    cfg = SamplingConfig(do_sample=True, top_k=2)
    prompt = [7, 1, 30, 2]
    drafter = DynamicTreeDrafter(model, depth=3, topk=4, nodes=50)
    drafter.start(torch.tensor([prompt]), 0)
    tree = drafter.propose_tree(torch.tensor([prompt]), 4, cfg, torch.Generator().manual_seed(0), 3)
    # 2 root children, both expanded (2 x 2), the 4 best of those expanded (4 x 2).
    assert tree.n == 2 + 4 + 8
    contexts = _node_contexts(tree, prompt)
    for n in range(tree.n):
        q = logits_to_probs(_next_logits(model, contexts[n]), cfg)
        assert q[tree.tokens_h[n]] > 0, f"node {n} proposes token {tree.tokens_h[n]} of probability 0"
    q_root = logits_to_probs(_next_logits(model, prompt), cfg)
    assert sorted(_children_tokens(tree, -1)) == sorted(torch.nonzero(q_root).flatten().tolist())


def test_static_tree_under_top_k_sampling_draws_only_tokens_with_mass():
    """Static [3, 3] under top-k=2 sampling: each node gets as many children as its filtered distribution has
    tokens with mass (2, not 3), exactly those tokens (drawn without replacement), each row of draws a distribution."""
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import SamplingConfig, logits_to_probs

    model = tiny_random_model(64, seed=5, logit_scale=2.0)
    cfg = SamplingConfig(do_sample=True, top_k=2)
    prompt = [11, 4, 60]
    for seed in range(3):
        drafter = StaticTreeDrafter(model, [3, 3])
        drafter.start(torch.tensor([prompt]), 0)
        tree = drafter.propose_tree(torch.tensor([prompt]), 3, cfg, torch.Generator().manual_seed(seed), 5)
        assert tree.n == 2 + 2 * 2 and tree.parents[:2] == [-1, -1]
        for node in [-1, *tree.children(-1)]:
            context = prompt + [tree.tokens_h[a] for a in (tree.path(node) if node >= 0 else [])]
            support = torch.nonzero(logits_to_probs(_next_logits(model, context), cfg)).flatten().tolist()
            assert sorted(_children_tokens(tree, node)) == sorted(support)
        assert torch.allclose(tree.draws.sum(dim=1), torch.ones(tree.n))


class _SameRowsDraft:
    """A stand-in for a drafter's model half: the same hand-made logits after every path, and a record of the
    device of every level of tokens it is fed (no model: the sequence may live on the meta device)."""

    def __init__(self, row: torch.Tensor) -> None:
        self.row, self.last_widths, self.fed_on = row, [], []

    def root_logits(self, ids, length):
        self.last_widths = [length]
        return self.row.clone()

    def level_logits(self, keys, tokens, ancestors, depths):
        self.fed_on.append(tokens.device)
        self.last_widths.append(len(keys))
        return self.row[None].expand(len(keys), -1).clone()


META = torch.device("meta")
# On the meta device (the CPU-only stand-in for a GPU) building a Tree raises where it reads its tokens back: a
# tree made on the sequence's device raises that, a tree made on the CPU instead would come back (wrong on CUDA).
ON_META = "Cannot copy out of meta tensor"


def test_dynamic_tree_feeds_and_proposes_tokens_on_the_sequences_device(tiny_pair):
    """The dynamic drafter builds each level's tokens for the draft model and the proposed tree on the device of
    the sequence (ids on CUDA: tokens on the CPU would fail in the draft's embedding and in the target's pass)."""
    from speclab.decoding.sampling import GREEDY

    drafter = DynamicTreeDrafter(tiny_pair[1], depth=3, topk=2, nodes=5)
    drafter.draft = stub = _SameRowsDraft(torch.arange(8, dtype=torch.float32))
    with pytest.raises(NotImplementedError, match=ON_META):
        drafter.propose_tree(torch.zeros(1, 4, dtype=torch.long, device=META), 4, GREEDY, None, 3)
    assert stub.fed_on == [META, META] and stub.last_widths == [4, 2, 2]


@pytest.mark.parametrize("kind", ["static", "dynamic", "lookup"])
def test_an_empty_tree_is_on_the_sequences_device(tiny_pair, kind):
    """With no depth left (max_depth 0) every tree drafter returns the empty tree on the sequence's device."""
    from speclab.decoding.sampling import GREEDY

    drafter = {"static": lambda: StaticTreeDrafter(tiny_pair[1], [2]),
               "dynamic": lambda: DynamicTreeDrafter(tiny_pair[1]), "lookup": lambda: LookupTreeDrafter()}[kind]()
    with pytest.raises(NotImplementedError, match=ON_META):
        drafter.propose_tree(torch.zeros(1, 4, dtype=torch.long, device=META), 4, GREEDY, None, 0)
    # On the CPU the same call is the empty tree, and the draft model did not run.
    tree = drafter.propose_tree(torch.zeros(1, 4, dtype=torch.long), 4, GREEDY, None, 0)
    assert tree.n == 0 and tree.tokens.dtype == torch.long and drafter.last_widths == []


def test_tree_drafters_project_only_the_positions_they_use_onto_the_vocabulary():
    """The draft's prefill and its catch-up pass project one position onto the vocabulary (the last), a level one
    per node: a whole prompt's projection would add real prefill/draft time on a large-vocabulary model."""
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import GREEDY

    model = tiny_random_model(64, seed=6)
    rows = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[:-1].numel()))
    try:
        ids = torch.tensor([[3, 8, 1, 9, 4, 7, 2, 6]])
        drafter = StaticTreeDrafter(model, [2, 1])
        drafter.start(ids, 5)  # prefill: 5 context tokens
        tree = drafter.propose_tree(ids, 8, GREEDY, None, 2)  # catch-up over 3 tokens, then one level of 2 nodes
    finally:
        hook.remove()
    assert rows == [1, 1, 2] and tree.n == 4 and drafter.last_widths == [3, 2]


def test_a_fresh_tree_drafter_reports_no_draft_calls():
    """Before any proposal a drafter's ``last_widths`` is the empty list (no draft-model calls), as the protocol says."""
    from speclab.models.loading import tiny_random_model

    model = tiny_random_model(64, seed=0)
    assert StaticTreeDrafter(model).last_widths == []
    assert DynamicTreeDrafter(model).last_widths == []
    assert LookupTreeDrafter().last_widths == []


def test_tree_draft_with_a_sliding_window_layer_is_refused_naming_the_model():
    """A draft whose cache has sliding-window layers cannot keep a tree path: start() refuses it, and the message
    names the draft model's class and its odd layers."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    drafter = StaticTreeDrafter(Gemma3ForCausalLM(cfg).eval(), [2])
    with pytest.raises(ValueError, match=r"^Gemma3ForCausalLM has cache layers \['DynamicSlidingWindowLayer'\]: a "
                                         r"tree draft needs plain full-attention layers"):
        drafter.start(torch.tensor([[1, 2, 3]]), 2)


def test_static_tree_bad_branching_message():
    """A bad static shape is refused with the value and what is allowed, in full."""
    import re

    from speclab.models.loading import tiny_random_model

    with pytest.raises(ValueError, match="^" + re.escape("branching=[2, 0] is not allowed: use a non-empty list of "
                                                         "integers >= 1 (children per node at each depth)") + "$"):
        StaticTreeDrafter(tiny_random_model(64, seed=0), [2, 0])
