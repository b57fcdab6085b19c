import torch

from speclab.sampling import SamplingConfig, logits_to_probs

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
