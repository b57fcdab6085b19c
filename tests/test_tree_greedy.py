"""Greedy tree speculative decoding reproduces plain greedy token for token.

Static, dynamic and prompt-lookup trees on three architectures (Llama: rotary; GPT-2: learned absolute
positions, so a node's position id must be context length - 1 + depth; GPT-NeoX: partial rotary, eager
attention), with and without a merged prefill. An accepted path that is not a prefix of the node order
moves scattered cache slots (``keep_path``'s gather) in the target's and the draft model's caches: a
wrong slot, mask or position changes the output at once, and a wrong draft cache shows up as lost
acceptance with a perfect draft.
"""
import pytest
import torch

from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import draft_variant
from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.trees.tree_loop import tree_generate
from test_batch_greedy import ARCHS, V, perturbed_copy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_NEW = 30
LENGTHS = (1, 6, 11)
# Repeated n-grams with different continuations: the lookup tree branches at its root.
LOOKUP_PROMPTS = [[7, 3, 9, 7, 3, 12, 7, 3, 5, 40, 7, 3], [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 8, 1, 2]]


def recording(drafter):
    """Wrap the drafter's methods (instance attributes) to log every proposed tree and kept path."""
    log = {"trees": [], "paths": []}
    propose, keep = drafter.propose_tree, drafter.keep

    def propose_tree(*args, **kwargs):
        tree = propose(*args, **kwargs)
        log["trees"].append(tree)
        return tree

    def keep_(path):
        log["paths"].append(list(path))
        return keep(path)

    drafter.propose_tree, drafter.keep = propose_tree, keep_
    return log


def scattered(paths):
    """Paths whose nodes are not the first nodes in order: keep_path had to gather slots."""
    return [p for p in paths if p != list(range(len(p)))]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch(request):
    target = ARCHS[request.param]()
    draft = perturbed_copy(target)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in LENGTHS]
    plain = [plain_greedy(target, p[None], N_NEW).tokens for p in prompts]
    return request.param, target, draft, prompts, plain


MAKERS = {
    "static-3211": lambda d: StaticTreeDrafter(d, [3, 2, 1, 1]),
    "static-chain": lambda d: StaticTreeDrafter(d, [1, 1, 1]),
    "dynamic": lambda d: DynamicTreeDrafter(d, depth=4, topk=3, nodes=10),
}


@pytest.mark.parametrize("merge_prefill", [True, False])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_model_trees_equal_plain_greedy(arch, kind, merge_prefill):
    name, target, draft, prompts, plain = arch
    paths = []
    for p, expected in zip(prompts, plain):
        drafter = MAKERS[kind](draft)
        log = recording(drafter)
        res = tree_generate(target, drafter, p[None], N_NEW, merge_prefill=merge_prefill)
        assert res.tokens == expected, f"{name} {kind} merge_prefill={merge_prefill} prompt {p.tolist()}"
        assert sum(it.new_tokens for it in res.iterations) == N_NEW
        first = res.iterations[0]
        # The merged first pass carries the whole prompt; otherwise only its last token is pending.
        pending = p.shape[0] if merge_prefill else 1
        assert first.target_fed == pending + first.tree_nodes
        assert first.with_prompt == (merge_prefill and p.shape[0] > 1)
        for it, tree in zip(res.iterations, log["trees"]):
            assert it.tree_nodes == tree.n and it.k == tree.max_depth
            assert it.new_tokens == it.accepted + 1 or it is res.iterations[-1]
        paths += log["paths"]
    assert any(0 < len(p) for p in paths), "some proposal should be accepted"
    if kind != "static-chain":
        assert scattered(paths), "some accepted path should not be a prefix of the node order"


@pytest.mark.parametrize("merge_prefill", [True, False])
def test_lookup_trees_equal_plain_greedy(arch, merge_prefill):
    name, target, _, _, _ = arch
    branched, accepted = False, 0
    for tokens in LOOKUP_PROMPTS:
        ids = torch.tensor([tokens])
        expected = plain_greedy(target, ids, 40).tokens
        drafter = LookupTreeDrafter(max_ngram=3, min_ngram=1, branches=4, depth=5)
        log = recording(drafter)
        res = tree_generate(target, drafter, ids, 40, merge_prefill=merge_prefill)
        assert res.tokens == expected, f"{name} lookup merge_prefill={merge_prefill} prompt {tokens}"
        branched |= any(len(t.children(node)) > 1 for t in log["trees"] for node in range(-1, t.n))
        accepted += sum(it.accepted for it in res.iterations)
    assert branched, "some lookup tree should have more than one branch"
    assert accepted > 0, "prompt lookup should accept some proposals (the outputs repeat themselves)"


def _eos_inside_path(plain, depth):
    """An output index (not the first) whose token first occurs there and that a perfect draft accepts
    as a tree node, not as the bonus token (each iteration emits depth + 1 tokens), and not as the
    path's last node; None if there is none."""
    return next((i for i in range(1, len(plain)) if plain.index(plain[i]) == i and i % (depth + 1) < depth - 1),
                None)


def test_eos_inside_accepted_path_stops_output(arch):
    name, target, draft, prompts, plain = arch
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    used = 0
    for p, full in zip(prompts, plain):
        i = _eos_inside_path(full, 4)
        if i is None:
            continue
        used += 1
        eos = full[i]
        expected = full[: i + 1]
        assert plain_greedy(target, p[None], N_NEW, eos_token_id=eos).tokens == expected
        res = tree_generate(target, StaticTreeDrafter(perfect, [3, 2, 1, 1]), p[None], N_NEW, eos_token_id=eos)
        assert res.tokens == expected, f"{name} eos={eos} at {i}"
        last = res.iterations[-1]
        assert last.accepted == 4 and last.new_tokens < last.accepted, "EOS should arrive inside the accepted path"
        for drafter in (StaticTreeDrafter(draft, [3, 2, 1, 1]), DynamicTreeDrafter(draft, 4, 3, 10)):
            assert tree_generate(target, drafter, p[None], N_NEW, eos_token_id=[V - 1, eos]).tokens == \
                plain_greedy(target, p[None], N_NEW, eos_token_id=[V - 1, eos]).tokens
    assert used >= 2


@pytest.mark.parametrize("n_new", range(1, 10))
def test_token_budgets(arch, n_new):
    name, target, draft, prompts, plain = arch
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    for drafter in (StaticTreeDrafter(perfect, [3, 2, 1, 1]), StaticTreeDrafter(draft, [3, 2, 1, 1]),
                    DynamicTreeDrafter(draft, 4, 3, 10)):
        res = tree_generate(target, drafter, prompts[1][None], n_new)
        assert res.tokens == plain[1][:n_new], f"{name} {type(drafter).__name__} budget {n_new}"
        done = 0
        for it in res.iterations:
            assert it.k + 1 <= n_new - done, "a tree deeper than the budget left"
            done += it.new_tokens
        assert done == n_new


def test_chain_tree_accepts_what_the_chain_loop_accepts(arch):
    name, target, draft, prompts, plain = arch
    for k in (1, 3, 5):
        for p in prompts:
            chain = speculative_generate(target, draft, p[None], N_NEW, k=k)
            tree = tree_generate(target, StaticTreeDrafter(draft, [1] * k), p[None], N_NEW)
            assert tree.tokens == chain.tokens
            assert [(it.k, it.accepted, it.new_tokens) for it in tree.iterations] == \
                [(it.k, it.accepted, it.new_tokens) for it in chain.iterations], f"{name} k={k}"
            assert all(it.tree_nodes == it.k for it in tree.iterations)


@pytest.mark.parametrize("branching", [[3, 2, 1, 1], [2, 2, 2]])
def test_perfect_draft_accepts_a_full_depth_path_every_iteration(arch, branching):
    name, target, _, prompts, plain = arch
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    depth = len(branching)
    for p, expected in zip(prompts, plain):
        drafter = StaticTreeDrafter(perfect, branching)
        log = recording(drafter)
        res = tree_generate(target, drafter, p[None], N_NEW)
        assert res.tokens == expected
        assert all(it.accepted == it.k and it.bonus for it in res.iterations), \
            f"{name} {branching}: {[(it.k, it.accepted) for it in res.iterations]}"
        assert [it.k for it in res.iterations][:N_NEW // (depth + 1)] == [depth] * (N_NEW // (depth + 1))
        # The draft's top child is the target's choice: the path is every level's first node, a gather.
        assert scattered(log["paths"])
