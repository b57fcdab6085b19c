"""The whole sampling loop, caches and rollback included, keeps the target's joint distribution."""
import numpy as np
import pytest
import torch

from speclab.decoding.acceptance import accept_keep_draft, accept_sample
from speclab.decoding.cache import forward_logits, new_cache
from speclab.decoding.loop import speculative_generate
from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import SamplingConfig, logits_to_probs
from speclab.stats.goodness_of_fit import chi_square

V = 8
PROMPT = torch.tensor([[3, 1, 4]])
SAMPLING = SamplingConfig(do_sample=True, temperature=1.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    return tiny_random_model(V, seed=10, logit_scale=4.0), tiny_random_model(V, seed=11, logit_scale=4.0)


def exact_pair_distribution(model, cfg=SAMPLING):
    """P(t1, t2 | prompt) by enumerating all V first tokens."""
    p1 = logits_to_probs(forward_logits(model, PROMPT, new_cache(model), 1)[-1], cfg)
    joint = torch.zeros(V, V)
    for t1 in range(V):
        ctx = torch.cat([PROMPT, torch.tensor([[t1]])], dim=1)
        joint[t1] = p1[t1] * logits_to_probs(forward_logits(model, ctx, new_cache(model), 1)[-1], cfg)
    return joint.flatten().numpy()


def pair_counts(target, draft, rule, runs, cfg=SAMPLING):
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros(V * V)
    for _ in range(runs):
        out = speculative_generate(target, draft, PROMPT, 3, k=2, sampling=cfg, generator=g, rule=rule).tokens
        counts[out[0] * V + out[1]] += 1
    return counts


@pytest.mark.slow
def test_sampling_loop_matches_exact_joint(models):
    target, draft = models
    joint = exact_pair_distribution(target)
    draft_joint = exact_pair_distribution(draft)
    # The test has power only if the draft is far from the target.
    assert 0.5 * np.abs(joint - draft_joint).sum() > 0.2
    assert chi_square(pair_counts(target, draft, accept_sample, 6000), joint).pvalue > 0.001


@pytest.mark.slow
def test_sampling_loop_with_wrong_rule_is_detected(models):
    target, draft = models
    joint = exact_pair_distribution(target)
    assert chi_square(pair_counts(target, draft, accept_keep_draft, 2000), joint).pvalue < 1e-6


@pytest.mark.slow
def test_sampling_loop_with_top_k_and_temperature(models):
    target, draft = models
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=4)
    joint = exact_pair_distribution(target, cfg)
    counts = pair_counts(target, draft, accept_sample, 3000, cfg)
    assert counts[joint == 0].sum() == 0  # nothing outside the top-k is ever emitted
    assert chi_square(counts, joint).pvalue > 0.001


@pytest.mark.slow
def test_bonus_token_follows_the_target_after_every_accepted_proposal(models):
    """Draft = target: the proposal is always accepted, so the second token is the bonus, drawn from the target's
    row after the proposal; drawn from the proposal's own row (the prompt's distribution again) the pair
    distribution would be p1(t1) p1(t2), far from the exact joint."""
    import copy

    target = models[0]
    draft = copy.deepcopy(target)
    joint = exact_pair_distribution(target)
    p1 = joint.reshape(V, V).sum(1)
    assert 0.5 * np.abs(joint - np.outer(p1, p1).flatten()).sum() > 0.15  # the wrong row would be seen
    g = torch.Generator().manual_seed(99)
    counts = np.zeros(V * V)
    for _ in range(2000):
        out = speculative_generate(target, draft, PROMPT, 2, k=1, sampling=SAMPLING, generator=g)
        assert [(it.k, it.accepted, it.bonus) for it in out.iterations] == [(1, 1, True)]
        counts[out.tokens[0] * V + out.tokens[1]] += 1
    assert chi_square(counts, joint).pvalue > 0.001
