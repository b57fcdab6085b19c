"""The acceptance rules on synthetic distributions: the correct rule reproduces p, the wrong ones do not."""
import numpy as np
import pytest
import torch

from speclab.decoding.acceptance import (
    accept_greedy,
    accept_keep_draft,
    accept_sample,
    accept_sample_resample_target,
    residual,
    sampling_rule,
)
from speclab.stats.goodness_of_fit import chi_square

P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])
N_DRAWS = 20_000


def _one_token_counts(rule, p, q, n=N_DRAWS, seed=0):
    """Draw x ~ q, apply the rule with k = 1, record the emitted first token."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.multinomial(q, n, replacement=True, generator=g)
    p_rows = torch.stack([p, p])  # row 0 verifies x, row 1 would give the bonus
    q_rows = q.view(1, -1)
    counts = np.zeros(p.shape[0])
    for x in xs:
        n_acc, nxt = rule(x.view(1), p_rows, q_rows, g)
        counts[int(x) if n_acc == 1 else nxt] += 1
    return counts


def test_correct_rule_reproduces_target():
    res = chi_square(_one_token_counts(accept_sample, P, Q), P.numpy())
    assert res.pvalue > 0.001


@pytest.mark.parametrize("rule", [accept_sample_resample_target, accept_keep_draft])
def test_wrong_rules_fail(rule):
    res = chi_square(_one_token_counts(rule, P, Q), P.numpy())
    assert res.pvalue < 1e-6


def test_draft_equal_to_target_accepts_everything():
    g = torch.Generator().manual_seed(1)
    k = 5
    props = torch.multinomial(P, k, replacement=True, generator=g)
    for _ in range(200):
        n, _ = accept_sample(props, P.repeat(k + 1, 1), P.repeat(k, 1), g)
        assert n == k


def test_greedy_rule_accepts_prefix_and_supplies_target_token():
    logits = torch.full((4, 6), -1.0)
    best = [2, 5, 1, 3]
    for row, b in enumerate(best):
        logits[row, b] = 1.0
    assert accept_greedy(torch.tensor([2, 5, 1]), logits) == (3, 3)  # all accepted, bonus from last row
    assert accept_greedy(torch.tensor([2, 4, 1]), logits) == (1, 5)  # rejected at 1: the target's arg-max
    assert accept_greedy(torch.tensor([0, 5, 1]), logits) == (0, 2)


def test_residual_is_positive_part_of_p_minus_q():
    r = residual(P, Q)
    expected = torch.clamp(P - Q, min=0)
    assert torch.allclose(r, expected / expected.sum())
    assert torch.equal(residual(P, P), P)  # nothing left over falls back to p


def test_zero_draft_probability_never_divides_by_zero():
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0]])
    n, nxt = accept_sample(torch.tensor([1]), p, q, torch.Generator().manual_seed(0))
    assert n == 1 and nxt in (0, 1)


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown acceptance rule 'bogus'"):
        sampling_rule("bogus")


def _rows(*dists):
    return torch.stack([torch.tensor(d) / sum(d) for d in dists])


# Four target rows over 6 tokens, each putting its mass on other tokens, so that a token drawn from the
# wrong row is seen at once.
P_ROWS = _rows([8, 1, 1, 0, 0, 0], [0, 8, 1, 1, 0, 0], [0, 0, 8, 1, 1, 0], [1, 0, 0, 1, 2, 6])


def _emitted(k, q, props, n_draws=4000, seed=3):
    g = torch.Generator().manual_seed(seed)
    counts, accepted = np.zeros(6), []
    for _ in range(n_draws):
        n, nxt = accept_sample(props, P_ROWS[: k + 1], q, g)
        accepted.append(n)
        counts[nxt] += 1
    return counts, accepted


def test_bonus_token_is_drawn_from_the_target_row_after_the_last_proposal():
    """Draft = target: every proposal is accepted and the bonus token follows p at position k, not an earlier row."""
    k = 3
    counts, accepted = _emitted(k, P_ROWS[:k], torch.tensor([0, 1, 2]))
    assert set(accepted) == {k}
    assert chi_square(counts, P_ROWS[k].numpy()).pvalue > 1e-3
    assert counts[5] > 0.5 * counts.sum()  # p[3] puts 0.6 on token 5, no earlier row puts any


def test_correction_after_a_rejection_is_drawn_from_that_positions_residual():
    """Proposal 1 has target probability 0: always rejected there, and the correction follows norm(max(p_1 - q_1, 0))."""
    k = 3
    q = _rows([8, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 8, 1, 1, 0])
    counts, accepted = _emitted(k, q, torch.tensor([0, 5, 2]))
    assert set(accepted) == {1}
    assert chi_square(counts, residual(P_ROWS[1], q[1]).numpy()).pvalue > 1e-3
    assert counts[[0, 5]].sum() == 0  # tokens of row 0 or of the bonus row would mean the wrong row
