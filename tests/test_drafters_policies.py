"""Prompt-lookup drafting and adaptive k: right proposals, exact output, k moving the right way."""
import numpy as np
import pytest
import torch

from speclab.decoding.drafters import ModelDrafter, PromptLookupDrafter, lookup_continuation
from speclab.decoding.k_policy import CostModelK, FixedK, HeuristicK
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import draft_variant
from speclab.decoding.sampling import GREEDY

PROMPTS = [[5], [3, 17, 9, 41, 2], [60, 1, 1, 1, 7, 22, 33, 12, 8]]


def test_lookup_proposes_what_followed_the_latest_match():
    seq = torch.tensor([7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 6, 1, 2, 3])
    # final 3-gram [1, 2, 3] occurred at 1 and 7; the latest (7) was followed by 8, 6, 1, 2
    assert lookup_continuation(seq, 4).tolist() == [8, 6, 1, 2]
    assert lookup_continuation(seq, 2).tolist() == [8, 6]


def test_lookup_prefers_longest_ngram():
    seq = torch.tensor([4, 2, 9, 0, 3, 2, 5, 4, 2])
    # 2-gram [4, 2] matches at 0 (followed by 9); the 1-gram [2] would match later at 5 (followed by 5)
    assert lookup_continuation(seq, 3, max_ngram=2).tolist() == [9, 0, 3]
    assert lookup_continuation(seq, 3, max_ngram=1).tolist() == [5, 4, 2]


def test_lookup_on_repeated_sequence_continues_the_cycle():
    cycle = [11, 12, 13, 14, 15]
    seq = torch.tensor(cycle * 3 + cycle[:2])
    assert lookup_continuation(seq, 5).tolist() == cycle[2:] + cycle[:2]


def test_lookup_without_repeat_proposes_nothing():
    assert lookup_continuation(torch.arange(20), 4).numel() == 0
    assert lookup_continuation(torch.tensor([3]), 4).numel() == 0
    d = PromptLookupDrafter()
    props, q = d.propose(torch.arange(10).view(1, -1), 10, 4, GREEDY, None)
    assert props.numel() == 0 and q is None


def test_lookup_bad_ngram_sizes():
    with pytest.raises(ValueError, match="min=3, max=2"):
        PromptLookupDrafter(max_ngram=2, min_ngram=3)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_prompt_lookup_equals_plain(tiny_pair, prompt, k):
    target, _ = tiny_pair
    ids = torch.tensor([prompt])
    plain = plain_greedy(target, ids, 40).tokens
    spec = speculative_generate(target, PromptLookupDrafter(), ids, 40, k=k)
    assert spec.tokens == plain
    # the tiny model falls into a cycle; lookup finds it and gets proposals accepted
    assert spec.accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", [lambda: HeuristicK(2), lambda: CostModelK(0.3, 1.0, k_min=1, decay=0.7)])
def test_adaptive_policies_keep_output_exact(tiny_pair, policy):
    target, draft = tiny_pair
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    for d in (draft, perfect):
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            assert speculative_generate(target, d, ids, 40, k=policy()).tokens == plain_greedy(target, ids, 40).tokens


def _ks(target, draft, policy):
    res = speculative_generate(target, ModelDrafter(draft), torch.tensor([PROMPTS[1]]), 60, k=policy)
    return [it.k for it in res.iterations[:-1]]  # the last iteration is cut by the token budget


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: HeuristicK(k_start=3, k_max=10),
                                  lambda: CostModelK(0.2, 1.0, k_min=1, k_max=10, decay=0.7)])
def test_adaptive_k_grows_on_perfect_draft_and_shrinks_on_useless(tiny_pair, make):
    target, useless = tiny_pair
    perfect = draft_variant(target, "copy", torch.device("cpu"))
    up = _ks(target, perfect, make())
    down = _ks(target, useless, make())
    assert up[-1] == 10 and up[-1] > up[0]
    assert down[-1] == 1 and max(down[-3:]) <= min(down[0], 3)


def test_heuristic_schedule_steps():
    p = HeuristicK(k_start=4, k_min=1, k_max=7)
    p.update(4, 4)
    assert p.k == 6
    p.update(6, 6)
    assert p.k == 7  # capped
    p.update(7, 2)
    assert p.k == 6
    p.start()
    assert p.k == 4


def test_cost_model_policy_tracks_alpha():
    p = CostModelK(0.3, 1.0, k_min=1, k_max=10, decay=0.7)
    for _ in range(10):
        p.update(p.k, p.k)
    assert p.alpha > 0.95 and p.k >= 6
    for _ in range(10):
        p.update(p.k, 0)
    assert p.alpha < 0.3 and p.k == 1  # one all-accepted k=10 iteration weighs ten checks


def _dear_table():
    from speclab.costs.time_model import CostTable

    # A draft step at 0.9 target steps and a jagged check: no k pays below alpha ~0.95.
    return CostTable({1: 0.9, 2: 1.0}, {k: 1.3 + 0.05 * k for k in range(1, 11)})


def test_cost_model_stops_speculating_where_no_k_pays_and_probes():
    p = CostModelK(0.9, 1.0, k_min=0, k_max=10, decay=0.7, table=_dear_table(), estimator="positions",
                   probe_every=4)
    for _ in range(3):
        p.update(p.k, 0)
    assert p.k == 0  # every k >= 1 is priced below a plain step
    ks = []
    for _ in range(20):
        k = p.k
        ks.append(k)
        p.update(k, 0)  # the draft keeps missing
    drafted = [i for i, k in enumerate(ks) if k]
    assert drafted and all(b - a == 5 for a, b in zip(drafted, drafted[1:]))  # 4 plain steps, then one probe
    # With k_min = 1 the same evidence keeps it drafting at its cheapest k.
    q = CostModelK(0.9, 1.0, k_min=1, k_max=10, decay=0.7, table=_dear_table(), estimator="positions")
    for _ in range(5):
        q.update(q.k, 0)
    assert q.k == 1


def test_cost_model_keeps_speculating_where_drafting_pays():
    from speclab.costs.time_model import CostTable

    cheap = CostTable({1: 0.1, 2: 0.12}, {k: 1.0 for k in range(1, 11)})
    p = CostModelK(0.1, 1.0, k_min=0, k_max=10, decay=0.7, table=cheap, estimator="positions")
    for _ in range(10):
        assert p.k >= 1
        p.update(p.k, p.k)
    assert p.k == 10


@pytest.mark.slow
def test_cost_model_with_plain_steps_keeps_output_exact(tiny_pair):
    target, useless = tiny_pair
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        pol = CostModelK(0.9, 1.0, k_min=0, k_max=6, decay=0.7, table=_dear_table(), estimator="positions",
                         probe_every=3)
        res = speculative_generate(target, ModelDrafter(useless), ids, 40, k=pol)
        assert res.tokens == plain_greedy(target, ids, 40).tokens
        ks = [it.k for it in res.iterations]
        assert 0 in ks and any(ks)  # plain steps and probes, the draft catching up after each run of plain steps
        assert max(it.draft_fed for it in res.iterations) >= 4


def test_policy_bad_values():
    with pytest.raises(ValueError, match="k=0"):
        FixedK(0)
    with pytest.raises(ValueError, match="decay=1.5"):
        CostModelK(0.3, 1.0, decay=1.5)
    with pytest.raises(ValueError, match="start=0"):
        HeuristicK(k_start=0)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_hybrid_drafter_greedy_equals_plain_and_uses_both_sources(tiny_pair, prompt, k):
    from speclab.decoding.drafters import HybridDrafter

    target, _ = tiny_pair
    noisy = draft_variant(target, "copy", torch.device("cpu"))
    with torch.no_grad():  # a draft that is right often, not always: both sources get to propose and fail
        for p in noisy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    ids = torch.tensor([prompt])
    drafter = HybridDrafter(noisy)
    spec = speculative_generate(target, drafter, ids, 40, k=k)
    assert spec.tokens == plain_greedy(target, ids, 40).tokens
    assert drafter.model_iterations > 0 and drafter.lookup_iterations > 0


@pytest.mark.slow
def test_hybrid_drafter_keeps_the_sampling_distribution():
    """First-two-token joint of the whole loop against the exact joint by enumeration (as test_loop_sampling)."""
    import numpy as np

    from speclab.decoding.cache import forward_logits, new_cache
    from speclab.decoding.drafters import HybridDrafter
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import SamplingConfig, logits_to_probs
    from speclab.stats.goodness_of_fit import chi_square

    V, prompt, cfg = 8, torch.tensor([[3, 1, 3]]), SamplingConfig(do_sample=True)  # the final 3 recurs: lookup proposes
    target, draft = tiny_random_model(V, seed=10, logit_scale=4.0), tiny_random_model(V, seed=11, logit_scale=4.0)
    p1 = logits_to_probs(forward_logits(target, prompt, new_cache(target), 1)[-1], cfg)
    joint = torch.stack([p1[t] * logits_to_probs(forward_logits(target, torch.cat([prompt, torch.tensor([[t]])], 1),
                                                                 new_cache(target), 1)[-1], cfg) for t in range(V)])
    g, counts, sources = torch.Generator().manual_seed(7), np.zeros(V * V), np.zeros(2)
    for _ in range(1500):
        d = HybridDrafter(draft)
        out = speculative_generate(target, d, prompt, 3, k=2, sampling=cfg, generator=g).tokens
        counts[out[0] * V + out[1]] += 1
        sources += (d.lookup_iterations, d.model_iterations)
    assert sources.min() > 0  # both sources proposed
    assert chi_square(counts, joint.flatten().numpy()).pvalue > 0.001


def test_lookup_label_is_the_matched_ngram_length_and_propose_reuses_the_match(tiny_pair):
    from speclab.decoding.drafters import HybridDrafter, lookup_match

    seq = torch.tensor([7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 6, 1, 2, 3])
    assert lookup_match(seq) == (3, 10)  # [1, 2, 3] last occurred at 7..9, followed from index 10
    assert lookup_match(seq, max_ngram=1) == (1, 10)  # the latest earlier 3 is at 9
    assert lookup_match(torch.arange(9)) == (0, -1)
    ids = seq.view(1, -1)
    d = PromptLookupDrafter()
    assert d.label(ids, 15) == 3 and d.label(ids, 7) == 0  # a different length is looked up again
    d.label(ids, 15)
    assert d.propose(ids, 15, 2, GREEDY, None)[0].tolist() == [8, 6]
    # Only label() keeps a match for propose(); after a rollback, or without a label, it is looked up afresh.
    d.label(ids, 15)
    d.rollback(14)
    ids2 = ids.clone()
    ids2[0, 10] = 42
    assert d.propose(ids2, 15, 2, GREEDY, None)[0].tolist() == [42, 6]
    h = HybridDrafter(tiny_pair[1])
    assert h.label(ids, 15) == 3 and h.label(torch.arange(9).view(1, -1), 9) == "model"


def test_conditioned_policy_keeps_one_estimate_per_label():
    from speclab.decoding.k_policy import ConditionedK

    made = []

    def make(label):
        made.append(label)
        return CostModelK(0.0, {k: 1.0 + 0.05 * k for k in range(1, 11)}, k_min=1, k_max=10, decay=0.7)

    p = ConditionedK(make)
    for _ in range(6):  # label 3: every proposal accepted; label 1: none
        p.condition(3)
        p.update(p.k, p.k)
        p.condition(1)
        p.update(p.k, 0)
    p.condition(3)
    long_k = p.k
    p.condition(1)
    assert long_k == 10 and p.k == 1
    assert made == [None, 3, 1]
    p.start()  # a new generation forgets every label's evidence
    p.condition(3)
    assert p.k < long_k and made[-2:] == [None, 3]


def test_conditioned_cost_model_is_exact_and_prices_labels_apart(tiny_pair):
    """Greedy output equals plain with lookup and the hybrid under the label-conditioned policy, and
    the policy saw the matched n-gram lengths (and the hybrid's model iterations) as separate labels."""
    from speclab.decoding.drafters import HybridDrafter
    from speclab.decoding.k_policy import ConditionedK
    from speclab.costs.time_model import CostTable

    target, draft = tiny_pair
    free = CostTable({1: 0.0, 2: 0.0}, {k: 1.0 + 0.1 * k for k in range(1, 9)})
    for drafter in (PromptLookupDrafter(), HybridDrafter(draft)):
        labels = set()
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            pol = ConditionedK(lambda label: CostModelK(0.0, free.verify, k_min=0, k_max=8, decay=0.7, table=free,
                                                        estimator="positions"))
            res = speculative_generate(target, drafter, ids, 40, k=pol)
            assert res.tokens == plain_greedy(target, ids, 40).tokens
            labels |= set(pol.policies) - {None}
        assert labels & {1, 2, 3}
        assert ("model" in labels) == isinstance(drafter, HybridDrafter)


@pytest.mark.slow
def test_conditioned_policy_keeps_the_sampling_distribution():
    """The label-conditioned cost model with the hybrid: the loop's first-two-token joint equals the
    target's exact joint (chi-square), so choosing k from the matched n-gram does not bias sampling."""
    import numpy as np

    from speclab.decoding.cache import forward_logits, new_cache
    from speclab.decoding.drafters import HybridDrafter
    from speclab.decoding.k_policy import ConditionedK
    from speclab.models.loading import tiny_random_model
    from speclab.decoding.sampling import SamplingConfig, logits_to_probs
    from speclab.stats.goodness_of_fit import chi_square
    from speclab.costs.time_model import CostTable

    V, prompt, cfg = 8, torch.tensor([[3, 1, 3]]), SamplingConfig(do_sample=True)
    target, draft = tiny_random_model(V, seed=10, logit_scale=4.0), tiny_random_model(V, seed=11, logit_scale=4.0)
    p1 = logits_to_probs(forward_logits(target, prompt, new_cache(target), 1)[-1], cfg)
    joint = torch.stack([p1[t] * logits_to_probs(forward_logits(target, torch.cat([prompt, torch.tensor([[t]])], 1),
                                                                 new_cache(target), 1)[-1], cfg) for t in range(V)])
    table = CostTable({1: 0.1, 2: 0.12}, {k: 1.0 for k in range(1, 5)})
    g, counts, ks = torch.Generator().manual_seed(7), np.zeros(V * V), set()
    for _ in range(1500):
        pol = ConditionedK(lambda label: CostModelK(0.1, table.verify, k_min=1, k_max=4, decay=0.7, table=table,
                                                    estimator="positions"))
        res = speculative_generate(target, HybridDrafter(draft), prompt, 3, k=pol, sampling=cfg, generator=g)
        counts[res.tokens[0] * V + res.tokens[1]] += 1
        ks.update(it.k for it in res.iterations)
    assert len(ks) > 1  # k moved with the labels
    assert chi_square(counts, joint.flatten().numpy()).pvalue > 0.001


def test_cost_model_estimate_is_decayed_accepted_over_decayed_checked_counts():
    """Hand-computed: prior 0.6 x 2 checks, decay 0.7; (proposed, accepted) = (4, 2), (3, 3), (5, 0) checks 3, 3 and
    1 proposals (a rejection is checked, what follows it is not)."""
    p = CostModelK(0.3, 1.0, k_min=1, k_max=10, decay=0.7, alpha0=0.6, prior_weight=2.0)
    acc, chk = 1.2, 2.0
    assert p.alpha == pytest.approx(acc / chk)
    for (proposed, accepted), checked in zip([(4, 2), (3, 3), (5, 0)], [3, 3, 1]):
        p.update(proposed, accepted)
        acc, chk = 0.7 * acc + accepted, 0.7 * chk + checked
        assert (p.acc, p.chk) == (pytest.approx(acc), pytest.approx(chk))
    assert p.alpha == pytest.approx(3.4916 / 5.256)
    # Per position: proposals accepted at each position, and checks that reached it.
    assert np.allclose(p.pos_acc[:4], [0.7 * 1.7, 0.7 * 1.7, 0.7 * 1.0, 0.0])
    assert np.allclose(p.pos_chk[:4], [0.7 * 1.7 + 1, 0.7 * 1.7, 0.7 * 1.7, 0.0])
    a = p.alpha
    rate = (p.pos_acc + 2.0 * a) / (p.pos_chk + 2.0)
    assert np.allclose(p.survival(), np.cumprod(np.minimum(rate, 0.999)))
    p.update(0, 0)  # a plain step (k_min = 1: the loop's last token) teaches nothing
    assert p.alpha == pytest.approx(3.4916 / 5.256)


def test_cost_model_k_is_the_best_predicted_k_for_its_estimate():
    from speclab.costs.cost_model import best_k

    p = CostModelK(0.2, 1.1, k_min=1, k_max=8, decay=0.5, alpha0=0.6, prior_weight=2.0)
    for proposed, accepted in [(2, 2), (3, 3), (4, 1), (5, 5)]:
        p.update(proposed, accepted)
        assert p.k == best_k(min(p.alpha, 0.999), 0.2, 1.1, 8)


def test_hybrid_uses_lookup_exactly_when_the_continuation_reaches_min_match(tiny_pair):
    from speclab.decoding.drafters import HybridDrafter

    seq = torch.tensor([7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 6, 1, 2, 3]).view(1, -1)  # [1, 2, 3] continues at 10
    assert HybridDrafter(tiny_pair[1], min_match=5).label(seq, 15) == 3  # 5 tokens follow the match: enough
    assert HybridDrafter(tiny_pair[1], min_match=6).label(seq, 15) == "model"
    assert HybridDrafter(tiny_pair[1], min_match=1).label(seq, 15) == 3


def _lookup_tree(drafter, tokens: list[int], max_depth: int = 10):
    """The (tokens, parents) of the tree a lookup drafter proposes after ``tokens``."""
    ids = torch.tensor([tokens])
    tree = drafter.propose_tree(ids, len(tokens), GREEDY, None, max_depth)
    return tree.tokens_h, tree.parents


def test_default_lookup_tree_uses_3_to_1_grams_4_branches_6_deep():
    """LookupTreeDrafter's defaults (n-grams 3 down to 1, the 4 latest matches, 6 tokens each), hand-computed."""
    from speclab.trees.tree_drafters import LookupTreeDrafter

    d = LookupTreeDrafter()
    # [1, 2, 3] recurs at 1 and 7 (a 4-gram would match only at 0): two branches, latest first, each 6 deep.
    seq = [9, 1, 2, 3, 50, 51, 7, 1, 2, 3, 60, 61, 9, 1, 2, 3]
    assert _lookup_tree(d, seq) == ([60, 61, 9, 1, 2, 3, 50, 51, 7, 1, 2, 3],
                                    [-1, 0, 1, 2, 3, 4, -1, 6, 7, 8, 9, 10])
    # Only the final 1-gram [4] recurs: a 1-gram match still proposes.
    assert _lookup_tree(d, [4, 8, 5, 6, 4]) == ([8, 5, 6, 4], [-1, 0, 1, 2])
    # [7] recurs 5 times: the 4 latest, each cut at the sequence's end or 6 tokens.
    seq = [7, 10, 7, 11, 7, 12, 7, 13, 7, 14, 7]
    assert _lookup_tree(d, seq) == ([14, 7, 13, 7, 14, 7, 12, 7, 13, 7, 14, 7, 11, 7, 12, 7, 13, 7],
                                    [-1, 0, -1, 2, 3, 4, -1, 6, 7, 8, 9, 10, -1, 12, 13, 14, 15, 16])


def test_lookup_tree_allows_equal_min_and_max_ngram_and_names_a_bad_size():
    """min_ngram == max_ngram is allowed (only that n-gram size is looked up); a size below 1 is refused by name."""
    from speclab.trees.tree_drafters import LookupTreeDrafter

    assert _lookup_tree(LookupTreeDrafter(max_ngram=2, min_ngram=2), [1, 2, 5, 1, 2]) == ([5, 1, 2], [-1, 0, 1])
    assert _lookup_tree(LookupTreeDrafter(max_ngram=2, min_ngram=2), [4, 8, 5, 6, 4]) == ([], [])
    with pytest.raises(ValueError, match=r"^max_ngram=0 is not allowed: use an integer >= 1$"):
        LookupTreeDrafter(max_ngram=0)
    with pytest.raises(ValueError, match=r"^n-gram sizes min=3, max=2 are not allowed: need 1 <= min <= max$"):
        LookupTreeDrafter(max_ngram=2, min_ngram=3)


def test_lookup_tree_without_a_match_is_an_empty_tree_of_token_ids():
    """No repeated n-gram: the empty tree, whose tokens are integer ids (appended to a sequence they stay ids)."""
    from speclab.trees.tree_drafters import LookupTreeDrafter

    seq = torch.arange(10)
    tree = LookupTreeDrafter().propose_tree(seq[None], 10, GREEDY, None, 5)
    assert tree.n == 0 and tree.tokens.dtype == torch.long
    assert torch.cat([seq, tree.tokens]).dtype == torch.long


class _ReadableOnMeta:
    """A sequence on an accelerator, as the lookup drafter sees it: values it can read back (a CUDA tensor's can be),
    a device other than the CPU (meta: a tensor made there cannot be read back, so building a Tree on it raises)."""

    device = torch.device("meta")

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __getitem__(self, index):
        return self.ids[index]


def test_lookup_tree_is_proposed_on_the_sequences_device():
    """The lookup tree's tokens are made on the sequence's device, not the CPU (the target's pass concatenates them
    with the sequence: on CUDA a CPU tree fails there)."""
    from speclab.trees.tree_drafters import LookupTreeDrafter

    seq = torch.tensor([[4, 8, 5, 6, 4]])
    assert _lookup_tree(LookupTreeDrafter(), seq[0].tolist()) == ([8, 5, 6, 4], [-1, 0, 1, 2])  # on the CPU
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        LookupTreeDrafter().propose_tree(_ReadableOnMeta(seq), 5, GREEDY, None, 5)
