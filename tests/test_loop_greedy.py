"""The greedy speculative loop reproduces plain greedy token for token (fails at once on a misaligned cache)."""
import time

import pytest
import torch

from speclab.decoding.acceptance import accept_sample
from speclab.decoding.batch import batch_speculative_generate
from speclab.decoding.cache import crop_to, forward_logits, new_cache
from speclab.decoding.drafters import HybridDrafter, PromptLookupDrafter
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import draft_variant, tiny_random_model
from speclab.decoding.sampling import GREEDY, SamplingConfig
from speclab.decoding.step import run_speculative

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
    from speclab.decoding.loop import GenerationResult, IterationStats

    its = [IterationStats(4, 2, False, 3, 0, 0, 0, 0), IterationStats(4, 4, True, 5, 0, 0, 0, 0),
           IterationStats(2, 0, False, 1, 0, 0, 0, 0)]
    res = GenerationResult([0] * 9, 1, 1.0, 0.0, iterations=its)
    # checked: 2 accepted + 1 rejected, 4 accepted, 1 rejected
    assert res.acceptance_rate == pytest.approx(6 / 8)
    assert res.proposal_efficiency == pytest.approx(6 / 10)
    assert res.tokens_per_target_pass == pytest.approx(3.0)


def test_loop_tensors_follow_the_prompts_device_not_the_default(tiny_pair):
    """Every tensor the greedy loop makes lands on the prompts' device, whatever torch's default device is."""
    target, draft = tiny_pair
    prompts, ids = [torch.tensor(p) for p in PROMPTS], _ids(PROMPTS[1])  # made on the CPU, outside the context
    calls = [
        # One row with EOS ids: every row proposes the same number, EOS is looked for among the tokens.
        lambda: speculative_generate(target, draft, ids, 12, k=3, eos_token_id=[63]).tokens,
        # Prompts of different lengths prefilled apart: the draft model starts from ragged contexts.
        lambda: batch_speculative_generate(target, HybridDrafter(draft), prompts, 10, k=3, eos_token_id=[63],
                                           merge_prefill=False).tokens,
        # Prompt lookup: a row with a match proposes next to rows without one (different numbers per row).
        lambda: batch_speculative_generate(target, PromptLookupDrafter(), prompts, 10, k=3).tokens,
    ]
    expected = [call() for call in calls]
    # A CUDA run's CPU default, on a CPU-only machine: a tensor made without the prompts' device lands on
    # meta, and combining it with the CPU tensors raises.
    with torch.device("meta"):
        assert [call() for call in calls] == expected


def test_sampled_loop_tensors_follow_the_prompts_device_not_the_default(tiny_pair):
    """The sampled acceptance's counts and tokens land on the prompts' device, whatever torch's default device is."""
    target, draft = tiny_pair
    prompts = [torch.tensor(p) for p in PROMPTS]
    hot = SamplingConfig(True, 1.0, 0, 1.0)

    def call():
        return batch_speculative_generate(target, draft, prompts, 8, k=3, sampling=hot,
                                          generator=torch.Generator().manual_seed(0)).tokens

    expected = call()
    with torch.device("meta"):
        assert call() == expected


def test_run_speculative_merges_the_prompt_by_default(tiny_pair):
    """run_speculative's default is the merged prefill: the first step's passes carry the whole prompt."""
    target, draft = tiny_pair
    prompt = PROMPTS[1]
    run = run_speculative(target, draft, [torch.tensor(prompt)], 8, 3, GREEDY, None, None, accept_sample, None)
    first = run.steps[0]
    assert first.with_prompt and first.target_fed == len(prompt) + first.counts[0]
    assert first.draft_fed == len(prompt)


def test_steps_record_one_entry_per_row(tiny_pair):
    """Each step records per row one length, count, acceptance, final length and done flag, consistent with each other."""
    target, draft = tiny_pair
    budget = 7
    run = run_speculative(target, draft, [torch.tensor(p) for p in PROMPTS], budget, 2, GREEDY, None, None,
                          accept_sample, None)
    for s, ids in zip(run.steps, run.row_ids):
        assert len(s.lengths) == len(s.counts) == len(s.accepted) == len(s.final) == len(s.done) == len(ids)
        assert all(n < f <= n + a + 1 for n, a, f in zip(s.lengths, s.accepted, s.final))
        assert s.done == [f - len(PROMPTS[i]) == budget for f, i in zip(s.final, ids)]


def test_times_lie_within_the_call(tiny_pair):
    """prefill_s, every iteration's total_s and wall_s are durations inside the call, in order and disjoint."""
    target, draft = tiny_pair
    for merge in (True, False):
        t0 = time.perf_counter()
        res = speculative_generate(target, draft, _ids(PROMPTS[1]), 10, k=3, merge_prefill=merge)
        outside = time.perf_counter() - t0
        assert res.prefill_s >= 0 and all(it.total_s >= 0 for it in res.iterations)
        assert res.prefill_s + sum(it.total_s for it in res.iterations) <= res.wall_s <= outside


def test_target_projects_only_the_positions_it_checks(tiny_pair):
    """The target's vocabulary projection runs on one position at a separate prefill and on k + 1 per
    verification pass, never on the prompt's other positions (that work would inflate the measured times)."""
    target, draft = tiny_pair
    positions = []
    handle = target.lm_head.register_forward_hook(
        lambda module, inputs, output: positions.append(inputs[0].numel() // inputs[0].shape[-1]))
    try:
        for merge in (True, False):
            positions.clear()
            res = speculative_generate(target, draft, _ids(PROMPTS[2]), 12, k=3, merge_prefill=merge)
            assert positions == ([] if merge else [1]) + [it.k + 1 for it in res.iterations]
    finally:
        handle.remove()


def test_two_token_prompt_rides_in_the_first_pass(tiny_pair):
    """Merged, a two-token prompt's first token is processed by the first iteration (with_prompt, target_fed);
    a one-token prompt or a separate prefill leaves nothing of the prompt to it."""
    target, draft = tiny_pair
    res = speculative_generate(target, draft, _ids([3, 17]), 6, k=2)
    assert [it.with_prompt for it in res.iterations[:2]] == [True, False]
    assert res.iterations[0].target_fed == 2 + res.iterations[0].k
    apart = speculative_generate(target, draft, _ids([3, 17]), 6, k=2, merge_prefill=False)
    one = speculative_generate(target, draft, _ids([3]), 6, k=2)
    assert not any(it.with_prompt for it in apart.iterations + one.iterations)


def test_draft_share_of_a_cache_holding_only_a_dummy_slot(tiny_pair):
    """A draft cache whose only slot is a masked dummy reports a masked share of 1."""
    target, _ = tiny_pair
    # Row 0 (one token, no n-gram match) drafts with the model; row 1's lookup proposes, so the model runs a
    # masked dummy slot for it. Row 0 accepts (the draft is the target) and leaves at its budget; row 1
    # rejects, and its last iteration proposes nothing: its draft cache is that one dummy slot.
    res = batch_speculative_generate(target, HybridDrafter(target), [torch.tensor([9]), torch.tensor([5, 7, 5])],
                                     2, k=1)
    assert [(it.rows, it.k, it.accepted) for it in res.iterations] == [(2, 1, 1), (1, 0, 0)]
    assert [it.draft_masked_share for it in res.iterations] == [0.5, 1.0]
