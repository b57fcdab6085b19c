import torch

import numpy as np

from speclab.decoding.sampling import SamplingConfig, choose_token, logits_to_probs

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_temperature_one_is_softmax():
    assert torch.allclose(logits_to_probs(LOGITS, SamplingConfig(True, 1.0)), torch.softmax(LOGITS, -1))


def test_top_k_keeps_k_most_likely():
    p = logits_to_probs(LOGITS, SamplingConfig(True, 1.0, top_k=2))
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert torch.isclose(p.sum(), torch.tensor(1.0))


def test_top_p_keeps_smallest_prefix_reaching_p():
    full = torch.softmax(LOGITS, -1)  # 0.574, 0.211, 0.128, 0.078, 0.029
    p = logits_to_probs(LOGITS, SamplingConfig(True, 1.0, top_p=0.7))
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())
    assert (logits_to_probs(LOGITS, SamplingConfig(True, 1.0, top_p=0.5)) > 0).sum() == 1


def test_low_temperature_sharpens():
    cold = logits_to_probs(LOGITS, SamplingConfig(True, 0.5))
    assert cold[0] > torch.softmax(LOGITS, -1)[0]


def test_batched_rows_processed_independently():
    rows = torch.stack([LOGITS, LOGITS.flip(0)])
    p = logits_to_probs(rows, SamplingConfig(True, 1.0, top_k=1))
    assert p[0, 0] == 1 and p[1, -1] == 1


def _nucleus_by_hand(logits, temperature, top_p):
    """Reference: scale by the temperature, softmax, keep the smallest most-likely prefix reaching top_p, renormalise."""
    p = np.exp(np.asarray(logits, dtype=float) / temperature)
    p /= p.sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(p, dtype=bool)
    keep[order[before < top_p]] = True
    out = np.where(keep, p, 0.0)
    return out / out.sum()


def test_temperature_is_applied_before_the_nucleus_is_chosen():
    """At T = 3 the distribution flattens and top_p = 0.6 needs three tokens; applied after the cut (at T = 1
    two tokens already reach 0.6) it would keep two."""
    for t, top_p, kept in [(3.0, 0.6, 3), (0.5, 0.6, 1), (1.0, 0.6, 2)]:
        got = logits_to_probs(LOGITS, SamplingConfig(True, t, top_p=top_p)).numpy()
        want = _nucleus_by_hand(LOGITS.numpy(), t, top_p)
        assert (got > 0).sum() == kept
        assert np.allclose(got, want, atol=1e-6)


def test_temperature_and_top_k_together():
    got = logits_to_probs(LOGITS, SamplingConfig(True, 2.0, top_k=3)).numpy()
    scaled = np.exp(LOGITS.numpy()[:3] / 2.0)
    assert np.allclose(got, np.r_[scaled / scaled.sum(), 0, 0], atol=1e-6)


def test_top_p_cut_exactly_at_the_boundary():
    """A token is dropped when the mass strictly before it already reaches top_p (>=), kept when it falls short."""
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    assert (logits_to_probs(logits, SamplingConfig(True, 1.0, top_p=0.5)) > 0).tolist() == [True, False, False]
    assert (logits_to_probs(logits, SamplingConfig(True, 1.0, top_p=0.51)) > 0).tolist() == [True, True, False]
    assert (logits_to_probs(logits, SamplingConfig(True, 1.0, top_p=0.75)) > 0).tolist() == [True, True, False]
    assert (logits_to_probs(logits, SamplingConfig(True, 1.0, top_p=0.76)) > 0).tolist() == [True, True, True]


def test_greedy_choice_ignores_the_sampling_filters_and_sampling_follows_them():
    assert choose_token(LOGITS, SamplingConfig(False), None) == 0
    g = torch.Generator().manual_seed(0)
    draws = [choose_token(LOGITS, SamplingConfig(True, 1.0, top_k=2), g) for _ in range(300)]
    assert set(draws) == {0, 1}
