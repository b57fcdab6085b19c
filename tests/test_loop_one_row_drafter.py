"""A drafter written against the one-row interface (start/propose/rollback) still runs in
``speculative_generate``, and the batched loop refuses it with one line."""
import pytest
import torch

from speclab.decoding.batch import batch_speculative_generate
from speclab.decoding.loop import plain_greedy, speculative_generate


class Oracle:
    """Proposes the target's own greedy continuation, wrong at every fifth proposal."""

    def __init__(self, text: list[int]) -> None:
        self.text, self.calls = text, []

    def start(self, ids, n_ctx):
        self.calls.append(("start", n_ctx))

    def propose(self, ids, length, k, sampling, generator):
        props = torch.tensor(self.text[length: length + k])
        props[(torch.arange(props.numel()) + length) % 5 == 0] += 1
        return props, None

    def rollback(self, valid_length):
        self.calls.append(("rollback", valid_length))


@pytest.mark.parametrize("merge_prefill, n_ctx", [(True, 0), (False, 4)])
def test_one_row_drafter_runs_exactly(tiny_pair, merge_prefill, n_ctx):
    """Merged, the drafter gets no pre-processed context (its first propose sees the whole prompt);
    apart, all but the last prompt token."""
    target, _ = tiny_pair
    ids = torch.tensor([[3, 17, 9, 41, 2]])
    plain = plain_greedy(target, ids, 30).tokens
    oracle = Oracle(ids[0].tolist() + plain)
    res = speculative_generate(target, oracle, ids, 30, k=4, merge_prefill=merge_prefill)
    assert res.tokens == plain
    assert 0 < res.acceptance_rate < 1
    assert oracle.calls[0] == ("start", n_ctx)
    assert [it.with_prompt for it in res.iterations[:2]] == [merge_prefill, False]
    assert res.iterations[0].target_fed == (5 if merge_prefill else 1) + res.iterations[0].k
    lengths = [it.length + it.new_tokens for it in res.iterations]
    assert [v for name, v in oracle.calls[1:]] == [n - 1 for n in lengths]  # the verified prefix, before EOS cut
    with pytest.raises(ValueError, match="cannot draft for 2 rows"):
        batch_speculative_generate(target, oracle, [ids[0], ids[0]], 8)


class ReportingOracle:
    """Proposes the target's own greedy continuation and reports its work like a draft model (last_fed, last_calls)."""

    def __init__(self, text: list[int]) -> None:
        self.text = text
        self.last_fed = self.last_calls = 0

    def start(self, ids, n_ctx):
        pass

    def propose(self, ids, length, k, sampling, generator):
        self.last_fed, self.last_calls = 2, k
        return torch.tensor(self.text[length: length + k]), None

    def rollback(self, valid_length):
        pass


def test_iteration_without_proposals_reports_no_draft_work(tiny_pair):
    """An iteration that proposes nothing (the budget leaves room for the target's token only) reports no draft
    work, not the drafter's previous iteration's."""
    target, _ = tiny_pair
    ids = torch.tensor([[3, 17, 9, 41, 2]])
    plain = plain_greedy(target, ids, 6).tokens
    res = speculative_generate(target, ReportingOracle(ids[0].tolist() + plain), ids, 6, k=4)
    assert res.tokens == plain
    # 4 accepted + the bonus leave one token of the budget: the second iteration is a plain step.
    assert [(it.k, it.draft_fed, it.draft_calls) for it in res.iterations] == [(4, 2, 4), (0, 0, 0)]
