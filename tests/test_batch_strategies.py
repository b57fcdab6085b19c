"""Batched decoding with every drafter and k policy: greedy rows equal batch-1 plain greedy, token for token.

Prompt lookup, the hybrid drafter and per-row k policies make rows propose different numbers of
tokens in one iteration (a row without a match proposes nothing next to a row copying a long span;
a row's cost-model policy follows its own acceptance): the ragged feeds must keep every row exact.
Prompts have different lengths (1 to 14 tokens), and an EOS token ends rows at different times.
"""
import numpy as np
import pytest
import torch

from speclab.decoding.batch import batch_speculative_generate
from speclab.decoding.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.decoding.k_policy import ConditionedK, CostModelK
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import tiny_random_model
from speclab.costs.time_model import CostTable
from test_batch_greedy import perturbed_copy

V = 64
LENGTHS = (1, 6, 11, 3, 14, 2, 8, 5)
N_NEW = 30
TABLE = CostTable({1: 0.3, 2: 0.35}, {k: 1.0 + 0.08 * k for k in range(1, 9)})
FREE = CostTable({1: 0.0, 2: 0.0}, TABLE.verify)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# (drafter, policy) arms: a callable of the draft model each, so every run starts from fresh objects.
ARMS = {
    "lookup-fixed": lambda d: (PromptLookupDrafter(), 3),
    "lookup-conditioned": lambda d: (PromptLookupDrafter(), ConditionedK(
        lambda label: CostModelK(0.0, FREE.verify, k_min=0, k_max=8, table=FREE, estimator="positions"))),
    "hybrid-fixed": lambda d: (HybridDrafter(d), 3),
    "hybrid-cost-table": lambda d: (HybridDrafter(d), CostModelK(0.3, k_max=8, table=TABLE, estimator="positions")),
    "model-cost-chapter": lambda d: (ModelDrafter(d), CostModelK(0.3, 1.0, k_max=8)),
    "model-cost-table": lambda d: (d, CostModelK(0.3, k_min=0, k_max=8, table=TABLE, probe_every=2)),
}


@pytest.fixture(scope="module")
def setup():
    target = tiny_random_model(V, seed=0, num_layers=2)
    draft = perturbed_copy(target)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in LENGTHS]
    plain = [plain_greedy(target, p[None], N_NEW).tokens for p in prompts]
    # A token that ends rows at different positions, some early.
    firsts = {t: {out.index(t) for out in plain if t in out[: N_NEW - 5]} for out in plain for t in out}
    eos = max(sorted(firsts), key=lambda t: len(firsts[t]))
    ends = [plain_greedy(target, p[None], N_NEW, eos_token_id=eos).tokens for p in prompts]
    return target, draft, prompts, plain, eos, ends


@pytest.mark.parametrize("arm", sorted(ARMS))
@pytest.mark.parametrize("B", [1, 2, 3, 4, 8])
def test_batched_rows_equal_batch1_plain_greedy(setup, arm, B):
    target, draft, prompts, plain, eos, ends = setup
    drafter, k = ARMS[arm](draft)
    res = batch_speculative_generate(target, drafter, prompts[:B], N_NEW, k=k)
    assert res.tokens == plain[:B], f"{arm} B={B}"
    assert sum(res.accepted) > 0
    drafter, k = ARMS[arm](draft)
    res = batch_speculative_generate(target, drafter, prompts[:B], N_NEW, k=k, eos_token_id=eos)
    assert res.tokens == ends[:B], f"{arm} B={B} eos={eos}"
    assert sum(it.new_tokens for it in res.iterations) == sum(map(len, ends[:B]))
    assert sum(res.proposed) <= sum(it.k * it.rows for it in res.iterations)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_rows_propose_different_numbers_of_tokens(setup, arm):
    """The ragged case is exercised: some iteration has rows with fewer proposals than the widest."""
    target, draft, prompts, plain, _, _ = setup
    drafter, k = ARMS[arm](draft)
    res = batch_speculative_generate(target, drafter, prompts, N_NEW, k=k, compact_at=None)
    assert res.tokens == plain
    assert sum(res.proposed) < sum(it.k * it.rows for it in res.iterations)
    assert max(it.dummy_inputs for it in res.iterations) > 0


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_batch_of_one_is_the_batch1_loop(setup, arm):
    """At B = 1 both entry points run the same step: the same proposals, acceptances and tokens."""
    target, draft, prompts, _, eos, _ = setup
    for p in prompts[:3]:
        drafter, k = ARMS[arm](draft)
        one = speculative_generate(target, drafter, p[None], N_NEW, k=k, eos_token_id=eos)
        drafter, k = ARMS[arm](draft)
        batched = batch_speculative_generate(target, drafter, [p], N_NEW, k=k, eos_token_id=eos)
        assert batched.tokens == [one.tokens]
        assert [(it.k, it.accepted) for it in batched.iterations] == [(it.k, it.accepted) for it in one.iterations]
        assert all(it.masked_share == 0 for it in batched.iterations)


def test_each_row_runs_its_own_policy(setup):
    """A policy per row: the given one serves the first row, independent copies the others."""
    target, draft, prompts, plain, _, _ = setup
    pol = ConditionedK(lambda label: CostModelK(0.0, FREE.verify, k_min=0, k_max=8, table=FREE,
                                                estimator="positions"))
    one = ConditionedK(pol.make)
    speculative_generate(target, PromptLookupDrafter(), prompts[0][None], N_NEW, k=one)
    batch_speculative_generate(target, PromptLookupDrafter(), prompts[:4], N_NEW, k=pol)
    # The first row's policy saw exactly what the batch-1 loop's policy saw for the same prompt.
    assert set(pol.policies) == set(one.policies)
    assert {lab: p.alpha for lab, p in pol.policies.items()} == pytest.approx(
        {lab: p.alpha for lab, p in one.policies.items()})


def test_hybrid_batched_sampling_keeps_each_rows_distribution():
    """Sampled rows of a batched hybrid (lookup rows next to model rows in one iteration) keep the
    target's joint distribution of the first two tokens (exact joint by enumeration, as
    test_batch_sampling)."""
    from speclab.decoding.cache import forward_logits, new_cache
    from speclab.decoding.sampling import SamplingConfig, logits_to_probs
    from speclab.stats.goodness_of_fit import chi_square

    v, cfg, copies = 8, SamplingConfig(do_sample=True), 16
    prompts = [[3, 1, 3], [5], [2, 6, 4, 2, 6]]  # the first and last end in a repeated n-gram: lookup proposes
    target, draft = tiny_random_model(v, seed=10, logit_scale=4.0), tiny_random_model(v, seed=11, logit_scale=4.0)

    @torch.inference_mode()
    def joint(prompt):
        ids = torch.tensor([prompt])
        p1 = logits_to_probs(forward_logits(target, ids, new_cache(target), 1)[-1], cfg)
        ctx = torch.cat([ids.expand(v, -1), torch.arange(v)[:, None]], dim=1)
        return (p1[:, None] * logits_to_probs(target(input_ids=ctx).logits[:, -1], cfg)).flatten().double().numpy()

    g, counts, sources = torch.Generator().manual_seed(5), np.zeros((len(prompts), v * v)), np.zeros(2)
    rows = [torch.tensor(p) for p in prompts for _ in range(copies)]
    for _ in range(60):
        d = HybridDrafter(draft)
        out = batch_speculative_generate(target, d, rows, 3, k=2, sampling=cfg, generator=g).tokens
        for r, toks in enumerate(out):
            counts[r // copies, toks[0] * v + toks[1]] += 1
        sources += (d.lookup_iterations, d.model_iterations)
    assert sources.min() > 0
    for i, prompt in enumerate(prompts):
        assert chi_square(counts[i], joint(prompt)).pvalue > 0.001, f"prompt {prompt}"


@pytest.mark.parametrize("hybrid", [False, True])
@torch.inference_mode()
def test_row_forms_propose_what_each_row_would_alone(setup, hybrid):
    """Draft errors never show in greedy output (the target corrects them), so the row forms' proposals
    are checked directly: rows drafting different numbers of tokens (0 to 4), then rolled back by
    different amounts and drafting again, propose what the draft model (greedy) or prompt lookup
    would propose for that row alone."""
    from speclab.decoding.drafters import lookup_continuation
    from speclab.decoding.sampling import GREEDY
    from speclab.decoding.rows import Rows

    target, draft, prompts, plain, _, _ = setup
    rows = [torch.cat([p, torch.tensor(out[:6])]) for p, out in zip(prompts[:5], plain)]  # cycles: lookup matches
    st = Rows(rows, 40)
    d = HybridDrafter(draft) if hybrid else ModelDrafter(draft)
    d.start_rows(st.seq, st.plen - 1, [n - 1 for n in st.plen_h])

    def expected(b: int, k: int) -> list[int]:
        seq = st.seq[b, : st.length_h[b]]
        found = lookup_continuation(seq, k)
        if hybrid and k and found.numel():
            return found.tolist()
        return plain_greedy(draft, seq[None], k).tokens if k else []

    for ks, accepted in (([3, 0, 2, 4, 1], [1, 0, 2, 0, 1]), ([2, 4, 0, 3, 1], [2, 1, 0, 3, 0])):
        want = [expected(b, k) for b, k in enumerate(ks)]
        counts, _ = d.propose_rows(st.seq, st.length, st.length_h, ks, GREEDY, None)
        got = [st.seq[b, n: n + c].tolist() for b, (n, c) in enumerate(zip(st.length_h, counts))]
        assert got == want
        # Keep `accepted` proposals per row plus a token of "the target's" (its plain greedy one).
        n = torch.tensor(accepted)
        d.rollback_rows(st.length + n, accepted)
        for b, a in enumerate(accepted):
            st.seq[b, st.length_h[b] + a] = 7
        st.length, st.length_h = st.length + n + 1, [x + a + 1 for x, a in zip(st.length_h, accepted)]
    if hybrid:
        assert d.lookup_iterations and d.model_iterations


@pytest.mark.parametrize("arm", ["model-cost-table", "lookup-fixed"])
def test_equal_length_prompts_start_dense_and_stay_exact_when_rows_diverge(setup, arm):
    """Prompts of one length run without a mask until rows accept different numbers of proposals;
    the masks and positions built at that moment must describe the columns already there."""
    target, draft, _, _, _, _ = setup
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (7,), generator=g) for _ in range(4)]
    plain = [plain_greedy(target, p[None], N_NEW).tokens for p in prompts]
    drafter, k = ARMS[arm](draft)
    res = batch_speculative_generate(target, drafter, prompts, N_NEW, k=k, compact_at=None)
    assert res.tokens == plain
    assert max(it.masked_share for it in res.iterations) > 0  # the rows did diverge
