"""The greedy speculative loop reproduces plain greedy token for token (fails at once on a misaligned cache)."""
import pytest
import torch

from speclab.cache import crop_to, forward_logits, new_cache
from speclab.loop import plain_greedy, speculative_generate
from speclab.models import draft_variant, tiny_random_model

PROMPTS = [[5], [3, 17, 9, 41, 2], [60, 1, 1, 1, 7, 22, 33, 12, 8]]


def _ids(tokens):
    return torch.tensor([tokens])


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_plain_with_useless_draft(tiny_pair, k, prompt):
    target, draft = tiny_pair
    plain = plain_greedy(target, _ids(prompt), 40).tokens
    spec = speculative_generate(target, draft, _ids(prompt), 40, k=k)
    assert spec.tokens == plain
    assert len(spec.tokens) == 40
    assert sum(it.new_tokens for it in spec.iterations) == 40


@pytest.mark.parametrize("k", [1, 3, 6])
def test_perfect_draft_accepts_every_proposal(tiny_pair, k):
    target, _ = tiny_pair
    spec = speculative_generate(target, draft_variant(target, "copy", torch.device("cpu")), _ids(PROMPTS[1]), 36, k=k)
    assert spec.tokens == plain_greedy(target, _ids(PROMPTS[1]), 36).tokens
    assert spec.acceptance_rate == 1.0
    full = [it for it in spec.iterations if it.k == k]
    assert all(it.bonus and it.new_tokens == k + 1 for it in full)


def test_partial_draft_is_exact_and_accepts_some():
    """A draft made of half the target's layers agrees sometimes: mixed accept/reject paths stay exact."""
    target = tiny_random_model(64, seed=3, num_layers=4, logit_scale=2.0)
    draft = draft_variant(target, "layers:3", torch.device("cpu"))
    for k in (2, 4):
        for prompt in PROMPTS:
            spec = speculative_generate(target, draft, _ids(prompt), 40, k=k)
            assert spec.tokens == plain_greedy(target, _ids(prompt), 40).tokens
    assert any(0 < it.accepted < it.k for it in spec.iterations)


def test_eos_among_proposals_stops_output(tiny_pair):
    target, _ = tiny_pair
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    plain = plain_greedy(target, _ids(PROMPTS[2]), 30).tokens
    eos = plain[6]  # the 7th token: it arrives inside a block of accepted proposals at k = 4
    first = plain.index(eos)
    for draft in (perfect, tiny_pair[1]):
        spec = speculative_generate(target, draft, _ids(PROMPTS[2]), 30, k=4, eos_token_id=eos)
        assert spec.tokens == plain[: first + 1]
    assert plain_greedy(target, _ids(PROMPTS[2]), 30, eos_token_id=eos).tokens == plain[: first + 1]


def test_iteration_statistics_are_consistent(tiny_pair):
    target, draft = tiny_pair
    spec = speculative_generate(target, draft, _ids(PROMPTS[1]), 25, k=3)
    for it in spec.iterations:
        assert 0 <= it.accepted <= it.k <= 3
        assert it.new_tokens == it.accepted + 1
        assert min(it.draft_s, it.verify_s, it.rollback_s) >= 0
        assert it.total_s >= it.draft_s + it.verify_s + it.rollback_s
    assert spec.tokens_per_target_pass == pytest.approx(25 / len(spec.iterations))


def test_crop_to_keeps_prefix():
    model = tiny_random_model(64, seed=0)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    cache = new_cache(model)
    forward_logits(model, ids, cache, 1)
    crop_to(cache, 4)
    assert cache.get_seq_length() == 4
    resumed = forward_logits(model, ids[:, 4:], cache, 2)
    fresh = forward_logits(model, ids, new_cache(model), 2)
    assert torch.allclose(resumed, fresh, atol=1e-5)
    with pytest.raises(ValueError, match="cannot crop"):
        crop_to(cache, 99)


def test_acceptance_rate_counts_checked_proposals_only():
    from speclab.loop import GenerationResult, IterationStats

    its = [IterationStats(4, 2, False, 3, 0, 0, 0, 0), IterationStats(4, 4, True, 5, 0, 0, 0, 0),
           IterationStats(2, 0, False, 1, 0, 0, 0, 0)]
    res = GenerationResult([0] * 9, 1, 1.0, 0.0, iterations=its)
    # checked: 2 accepted + 1 rejected, 4 accepted, 1 rejected
    assert res.acceptance_rate == pytest.approx(6 / 8)
    assert res.proposal_efficiency == pytest.approx(6 / 10)
    assert res.tokens_per_target_pass == pytest.approx(3.0)
