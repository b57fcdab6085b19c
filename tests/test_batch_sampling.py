"""The batched sampling loop keeps each row's target joint distribution over its first two tokens.

Rows have different prompts (so different distributions and left padding); each prompt fills
several rows of the same batch, so one call gives several independent draws per prompt. The
exact joint P(t1, t2 | prompt) comes from enumerating all V first tokens; the wrong acceptance
rules of ``speclab.decoding.acceptance`` must fail the same test. Logits are sharpened (``logit_scale``
8) so that the second token depends enough on the context for a row that attended to a rejected
proposal (a rollback bug) to fail the test too, not only the greedy tests.
"""
import numpy as np
import pytest
import torch

from speclab.decoding.acceptance import accept_keep_draft, accept_sample, accept_sample_resample_target
from speclab.decoding.batch import batch_plain_generate, batch_speculative_generate
from speclab.decoding.cache import forward_logits, new_cache
from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import SamplingConfig, logits_to_probs
from speclab.stats.goodness_of_fit import chi_square

V = 16
PROMPTS = [[3, 1, 4], [7], [2, 9, 5, 11, 6, 6]]
COPIES = 16  # rows per prompt in each batch (48 rows: one call gives 16 draws per prompt)
SAMPLING = SamplingConfig(do_sample=True, temperature=1.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    return tiny_random_model(V, seed=10, logit_scale=8.0), tiny_random_model(V, seed=11, logit_scale=8.0)


@torch.inference_mode()
def exact_joint(model, prompt, cfg=SAMPLING) -> np.ndarray:
    """P(t1, t2 | prompt), flattened [V * V], by enumerating all V first tokens."""
    ids = torch.tensor([prompt])
    p1 = logits_to_probs(forward_logits(model, ids, new_cache(model), 1)[-1], cfg)
    ctx = torch.cat([ids.expand(V, -1), torch.arange(V)[:, None]], dim=1)
    p2 = logits_to_probs(model(input_ids=ctx).logits[:, -1], cfg)  # the V continuations in one pass
    return (p1[:, None] * p2).flatten().double().numpy()


def pair_counts(generate, calls: int) -> np.ndarray:
    """Counts of (t1, t2) per prompt over ``calls`` batched calls of COPIES rows per prompt: [prompts, V * V]."""
    prompts = [torch.tensor(p) for p in PROMPTS for _ in range(COPIES)]
    counts = np.zeros((len(PROMPTS), V * V))
    for _ in range(calls):
        for row, out in enumerate(generate(prompts).tokens):
            counts[row // COPIES, out[0] * V + out[1]] += 1
    return counts


def speculative(target, draft, rule, cfg=SAMPLING, seed=1234):
    g = torch.Generator().manual_seed(seed)
    # 3 new tokens with k = 2: the second token comes from the first iteration (accepted or
    # corrected) or, after an early rejection, from a second iteration on a rolled-back cache.
    return lambda prompts: batch_speculative_generate(target, draft, prompts, 3, k=2, sampling=cfg, generator=g,
                                                      rule=rule)


def test_draft_is_far_from_target(models):
    target, draft = models
    for prompt in PROMPTS:  # otherwise the test would have no power against the wrong rules
        assert 0.5 * np.abs(exact_joint(target, prompt) - exact_joint(draft, prompt)).sum() > 0.4


def test_batched_sampling_matches_exact_joint_per_row(models):
    target, draft = models
    counts = pair_counts(speculative(target, draft, accept_sample), 200)
    for i, prompt in enumerate(PROMPTS):
        assert chi_square(counts[i], exact_joint(target, prompt)).pvalue > 0.001, f"prompt {prompt}"


@pytest.mark.parametrize("rule", [accept_keep_draft, accept_sample_resample_target])
def test_wrong_rules_are_detected(models, rule):
    target, draft = models
    counts = pair_counts(speculative(target, draft, rule), 100)
    pvalues = [chi_square(counts[i], exact_joint(target, p)).pvalue for i, p in enumerate(PROMPTS)]
    assert min(pvalues) < 1e-6, pvalues


def test_batched_sampling_with_top_k_and_temperature(models):
    target, draft = models
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=4)
    counts = pair_counts(speculative(target, draft, accept_sample, cfg), 100)
    for i, prompt in enumerate(PROMPTS):
        joint = exact_joint(target, prompt, cfg)
        assert counts[i][joint == 0].sum() == 0  # nothing outside the top-k is ever emitted
        assert chi_square(counts[i], joint).pvalue > 0.001


def test_batched_plain_sampling_matches_exact_joint(models):
    target, _ = models
    g = torch.Generator().manual_seed(99)
    counts = pair_counts(lambda prompts: batch_plain_generate(target, prompts, 2, sampling=SAMPLING, generator=g), 100)
    for i, prompt in enumerate(PROMPTS):
        assert chi_square(counts[i], exact_joint(target, prompt)).pvalue > 0.001
