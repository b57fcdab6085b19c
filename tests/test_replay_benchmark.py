"""The lookup-policy replay (benchmarks/bench_lookup_policy_replay.py) makes the loop's own decisions:
on a tiny model its iterations equal the speculative loop's, for fixed k and the cost-model policy."""
import torch

from benchmarks.bench_lookup_policy_replay import replay
from speclab.decoding.drafters import PromptLookupDrafter
from speclab.decoding.k_policy import ConditionedK, CostModelK, FixedK
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.costs.time_model import CostTable

PROMPTS = [[3, 17, 9, 41, 2, 3, 17, 9, 41], [60, 1, 1, 1, 7, 22, 33, 12, 8, 1, 1, 7]]


def test_replay_iterations_equal_the_loop(tiny_pair):
    target, _ = tiny_pair
    free = CostTable({1: 0.0, 2: 0.0}, {k: 1.05 + 0.1 * k for k in range(1, 11)})

    def policies():
        yield FixedK(2)
        for k_min in (0, 1):
            yield ConditionedK(lambda label, k_min=k_min: CostModelK(0.0, free.verify, k_min=k_min, decay=0.7,
                                                                     table=free, estimator="positions"))

    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        new = plain_greedy(target, ids, 30).tokens
        for run, replayed in zip(policies(), policies()):
            res = speculative_generate(target, PromptLookupDrafter(), ids, 30, k=run)
            trace, _ = replay(prompt, new, replayed)
            assert list(trace.proposed) == [it.k for it in res.iterations]
            assert list(trace.new_tokens) == [it.new_tokens for it in res.iterations]
