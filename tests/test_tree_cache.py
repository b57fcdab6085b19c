"""The caches after a tree pass and ``keep_path``: every layer's keys and values equal a fresh prefill of
the context plus the accepted path, in the target's cache and in a tree drafter's own cache. And the
models a tree cannot serve are refused before any pass."""
import re

import pytest
import torch

from speclab.decoding.cache import forward_logits, new_cache
from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import GREEDY
from speclab.trees.tree import Tree, check_tree_model
from speclab.trees.path_cache import check_plain_cache, keep_path
from speclab.trees.tree_drafters import DynamicTreeDrafter, LookupTreeDrafter, StaticTreeDrafter
from speclab.trees.tree_loop import tree_generate, verify_tree
from test_batch_greedy import ARCHS, perturbed_copy
from test_loop_sliding_window import _gemma

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONTEXT = [5, 9, 4, 1, 7, 33, 2, 60]
# Depth 1: nodes 0, 1, 2; node 1 has three children (5, 6, 8); node 6 a child 10 at depth 3. Tokens repeat
# across branches, so only the mask tells them apart.
TOKENS = [10, 20, 30, 11, 21, 21, 22, 31, 23, 13, 24]
PARENTS = [-1, -1, -1, 0, 0, 1, 1, 2, 1, 3, 6]
PATHS = [[1, 6, 10], [2, 7], [1, 8], [0, 4]]  # none is a prefix of the node order


def fresh_prefill(model, tokens):
    cache = new_cache(model)
    logits = forward_logits(model, torch.tensor([tokens]), cache, len(tokens))
    return cache, logits


def assert_same_cache(cache, expected, what):
    assert cache.get_seq_length() == expected.get_seq_length(), what
    assert len(cache.layers) == len(expected.layers)
    for i, (got, want) in enumerate(zip(cache.layers, expected.layers)):
        assert got.keys.shape == want.keys.shape, f"{what}: layer {i} keys {tuple(got.keys.shape)}"
        assert torch.allclose(got.keys, want.keys, atol=1e-5), f"{what}: layer {i} keys"
        assert torch.allclose(got.values, want.values, atol=1e-5), f"{what}: layer {i} values"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return request.param, ARCHS[request.param]()


@pytest.mark.parametrize("pending", [1, 3, len(CONTEXT)])
def test_target_cache_after_verify_and_keep_path(model, pending):
    name, target = model
    tree = Tree(torch.tensor(TOKENS), PARENTS)
    length = len(CONTEXT)
    seen = length - pending
    seq = torch.tensor([CONTEXT + [0] * 8])
    full, full_logits = fresh_prefill(target, CONTEXT)
    for path in PATHS:
        cache = new_cache(target)
        if seen:
            forward_logits(target, seq[:, :seen], cache, 1)
        logits = verify_tree(target, cache, seq, seen, length, tree)
        assert logits.shape == (tree.n + 1, target.config.vocab_size)
        assert cache.get_seq_length() == length + tree.n
        # Row 0: the target after the context; row 1 + j: after the context and node j's root path.
        assert torch.allclose(logits[0], full_logits[-1], atol=1e-5), f"{name}: root logits"
        for j in range(tree.n):
            _, want = fresh_prefill(target, CONTEXT + [TOKENS[a] for a in tree.path(j)])
            assert torch.allclose(logits[1 + j], want[-1], atol=1e-4), f"{name}: logits of node {j}"
        with torch.inference_mode():  # as in tree_generate: the cache holds inference tensors
            keep_path(cache, length, [length + i for i in path])
        expected, _ = fresh_prefill(target, CONTEXT + [TOKENS[i] for i in path])
        assert_same_cache(cache, expected, f"{name} pending={pending} path={path}")


def test_keep_path_of_a_leading_path_and_of_nothing(model):
    name, target = model
    tree = Tree(torch.tensor(TOKENS), PARENTS)
    length = len(CONTEXT)
    seq = torch.tensor([CONTEXT])
    for path in ([0, 3, 9][:2], [0], []):
        cache = new_cache(target)
        forward_logits(target, seq[:, : length - 1], cache, 1)
        verify_tree(target, cache, seq, length - 1, length, tree)
        with torch.inference_mode():
            keep_path(cache, length, [length + i for i in path])
        expected, _ = fresh_prefill(target, CONTEXT + [TOKENS[i] for i in path])
        assert_same_cache(cache, expected, f"{name} path={path}")


def _non_leading_path(tree, prefer):
    """The root path of the ``prefer``-th deepest node whose path is not a prefix of the node order."""
    paths = [tree.path(j) for j in range(tree.n) if tree.depth[j] == tree.max_depth]
    paths = [p for p in paths if p != list(range(len(p)))]
    return paths[prefer % len(paths)]


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_draft_cache_after_keep(model, kind):
    name, target = model
    draft = perturbed_copy(target)
    length = len(CONTEXT)
    seq = torch.tensor([CONTEXT + [0] * 8])
    for n_ctx in (0, length - 1):
        for prefer in (1, -1):
            drafter = StaticTreeDrafter(draft, [3, 2, 1, 1]) if kind == "static" else \
                DynamicTreeDrafter(draft, depth=4, topk=3, nodes=12)
            with torch.inference_mode():  # as in tree_generate: the cache holds inference tensors
                drafter.start(seq, n_ctx)
                tree = drafter.propose_tree(seq, length, GREEDY, None, 10)
                assert tree.max_depth == 4
                path = _non_leading_path(tree, prefer)
                assert len(path) == 4
                drafter.keep(path)
            # The draft has run the context and every node with children: the path's first three nodes.
            assert drafter.draft.seen == length + 3
            expected, _ = fresh_prefill(draft, CONTEXT + [tree.tokens_h[i] for i in path[:3]])
            assert_same_cache(drafter.draft.cache, expected, f"{name} {kind} n_ctx={n_ctx} path={path}")


def _assert_one_line_refusal(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_sliding_window_model_is_refused():
    gemma = _gemma(0)
    cache = new_cache(gemma)
    with pytest.raises(ValueError) as excinfo:
        check_plain_cache(cache, gemma)
    _assert_one_line_refusal(excinfo, "Gemma3ForCausalLM", "DynamicSlidingWindowLayer")
    ids = torch.tensor([[5, 9, 4]])
    with pytest.raises(ValueError) as excinfo:
        tree_generate(gemma, LookupTreeDrafter(), ids, 4)
    _assert_one_line_refusal(excinfo, "DynamicSlidingWindowLayer")
    with pytest.raises(ValueError) as excinfo:
        StaticTreeDrafter(gemma, [2, 1]).start(torch.tensor([[5, 9, 4, 0, 0]]), 2)
    _assert_one_line_refusal(excinfo, "DynamicSlidingWindowLayer")
    check_plain_cache(new_cache(ARCHS["llama"]()), ARCHS["llama"]())  # a full-attention model passes


def test_flash_attention_is_refused():
    target = tiny_random_model(64, seed=0)
    check_tree_model(target)
    target.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError) as excinfo:
        check_tree_model(target)
    _assert_one_line_refusal(excinfo, "flash_attention_2")
    ids = torch.tensor([[5, 9, 4]])
    with pytest.raises(ValueError) as excinfo:
        tree_generate(target, LookupTreeDrafter(), ids, 4)
    _assert_one_line_refusal(excinfo, "flash_attention_2")
    with pytest.raises(ValueError) as excinfo:
        DynamicTreeDrafter(target)
    _assert_one_line_refusal(excinfo, "flash_attention_2")


def test_keep_path_outside_inference_mode():
    """A notebook user gathers a cache filled by the loops' passes (inference tensors) without inference mode."""
    target = tiny_random_model(64, seed=0)
    seq = torch.tensor([[5, 9, 4, 1]])
    cache = new_cache(target)
    forward_logits(target, seq[:, :3], cache, 1)
    verify_tree(target, cache, seq, 3, 4, Tree(torch.tensor([10, 20, 21]), [-1, -1, 1]))
    keep_path(cache, 4, [5, 6])
    assert cache.get_seq_length() == 6


def test_a_sliding_window_cache_is_refused_with_the_whole_message():
    """The refusal names the model and its odd cache layers, what a tree needs, and the drafters that still work."""
    gemma = _gemma(0)
    message = ("Gemma3ForCausalLM has cache layers ['DynamicSlidingWindowLayer']: a tree draft needs plain "
               "full-attention layers (DynamicLayer); use a chain (drafter model, prompt_lookup or hybrid)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_plain_cache(new_cache(gemma), gemma)
