"""Sampling with tree drafts keeps the target's distribution.

Rule level: the multi-candidate rule emits a token distributed as p for each way a drafter picks its
candidates (i.i.d. with replacement, without replacement, deterministic top-m), and accepts each
candidate as often as an enumeration of every candidate tuple says; the deliberately wrong rule (every
candidate against the original p) is detected; ``walk_sample`` hands the rule the recorded draws.
Loop level: the first two tokens of ``tree_generate`` (tree pass, walk, both caches' path gather)
follow the target's exact joint, found by enumeration as in test_loop_sampling.
"""
import itertools

import numpy as np
import pytest
import torch

from speclab.models.loading import tiny_random_model
from speclab.decoding.sampling import SamplingConfig
from speclab.stats.goodness_of_fit import chi_square
from speclab.trees.tree import Tree, point_masses, walk_sample
from speclab.trees.tree_drafters import DynamicTreeDrafter, StaticTreeDrafter
from speclab.trees.tree_loop import tree_generate
from speclab.trees.multi_candidate import accept_candidates, accept_candidates_fixed_p, without_replacement_rows
from test_loop_sampling import PROMPT, SAMPLING, V, exact_pair_distribution

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ---------------------------------------------------------------- rule level (no models)

RV, M = 6, 3


def _p_and_q():
    """A target p and a draft q far apart (total variation 0.44) that still share mass: every candidate
    index is accepted with probability >= 0.07 under each way of choosing candidates."""
    g = torch.Generator().manual_seed(7)
    return tuple(torch.softmax(1.2 * torch.randn(RV, generator=g), 0) for _ in range(2))


def _candidates(kind, q, g):
    """Candidates [M] and the rows [M, V] they were drawn from, for one way of choosing them."""
    if kind == "iid":
        x = torch.multinomial(q, M, replacement=True, generator=g)
        return x, q.expand(M, -1)
    if kind == "without_replacement":
        x = torch.multinomial(q, M, replacement=False, generator=g)
        return x, without_replacement_rows(q, x)
    x = torch.topk(q, M).indices
    return x, point_masses(x, RV)


def _outcomes(rule, kind, n, seed=0):
    """Counts of (accepted candidate index, emitted token): bin (i + 1) * RV + token, i = -1 a rejection of all."""
    p, q = _p_and_q()
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros((M + 1) * RV)
    for _ in range(n):
        x, rows = _candidates(kind, q, g)
        i, token = rule(x, p, rows, g)
        assert (i < 0 and token is not None) or (0 <= i < M and token == int(x[i]))
        counts[(i + 1) * RV + token] += 1
    return counts


def _emitted(outcomes):
    """The emitted token's counts or probabilities, whichever candidate (or none) was accepted."""
    return outcomes.reshape(M + 1, RV).sum(axis=0)


def exact_outcomes(kind):
    """The exact rule's distribution of (accepted index, token), by enumerating every ordered candidate tuple
    (numpy, float64, written apart from speclab's rule): candidate i is accepted with min(1, r_i(x) / q_i(x)),
    a rejection leaves r_{i+1} = norm(max(r_i - q_i, 0)), and after the last one the token comes from r."""
    p, q = (t.double().numpy() for t in _p_and_q())
    p, q = p / p.sum(), q / q.sum()
    if kind == "iid":
        tuples = [(x, np.prod(q[list(x)]), np.tile(q, (M, 1))) for x in itertools.product(range(RV), repeat=M)]
    elif kind == "without_replacement":
        tuples = []
        for x in itertools.permutations(range(RV), M):
            rows, prob, left = [], 1.0, q.copy()
            for t in x:
                rows.append(left / left.sum())
                prob *= rows[-1][t]
                left = left.copy()
                left[t] = 0.0
            tuples.append((x, prob, np.array(rows)))
    else:
        x = tuple(int(t) for t in np.argsort(-q)[:M])
        tuples = [(x, 1.0, np.eye(RV)[list(x)])]
    out = np.zeros((M + 1) * RV)
    for x, prob, rows in tuples:
        r, reach = p.copy(), prob
        for i, t in enumerate(x):
            a = min(1.0, r[t] / rows[i, t])
            out[(i + 1) * RV + t] += reach * a
            reach *= 1.0 - a
            left = np.maximum(r - rows[i], 0.0)
            r = left / left.sum() if left.sum() > 0 else r
        out[:RV] += reach * r
    assert abs(out.sum() - 1.0) < 1e-9
    return out


def test_rule_setup_has_power():
    p, q = _p_and_q()
    assert 0.5 * float((p - q).abs().sum()) > 0.25  # a draft far from the target
    for kind in ("iid", "without_replacement", "top"):
        exact = exact_outcomes(kind)
        assert np.allclose(_emitted(exact), p.double().numpy(), atol=1e-6)  # the reference itself keeps p
        assert exact.reshape(M + 1, RV).sum(axis=1).min() > 0.05  # every outcome kind matters


@pytest.mark.parametrize("kind", ["iid", "without_replacement", "top"])
def test_exact_rule_emits_p(kind):
    p, _ = _p_and_q()
    counts = _outcomes(accept_candidates, kind, 12000)
    assert chi_square(_emitted(counts), p.numpy()).pvalue > 1e-3
    # Not only the token: which candidate is accepted how often (the rule's efficiency) is the exact rule's.
    assert chi_square(counts, exact_outcomes(kind)).pvalue > 1e-3


@pytest.mark.parametrize("kind", ["iid", "without_replacement"])
def test_fixed_p_rule_is_detected(kind):
    p, _ = _p_and_q()
    counts = _outcomes(accept_candidates_fixed_p, kind, 4000)
    assert chi_square(_emitted(counts), p.numpy()).pvalue < 1e-6


@pytest.mark.parametrize("kind", ["without_replacement", "top"])
def test_walk_sample_applies_the_rule_to_the_recorded_draws(kind):
    """A one-level tree: walk_sample passes the recorded rows (sampled children) or point masses
    (deterministic children, no draws) to the rule."""
    p, q = _p_and_q()
    g = torch.Generator().manual_seed(5)
    counts = np.zeros((M + 1) * RV)
    p_rows = torch.stack([p] + [torch.full((RV,), 1.0 / RV)] * M)
    for _ in range(12000):
        x, rows = _candidates(kind, q, g)
        tree = Tree(x, [-1] * M, rows if kind == "without_replacement" else None)
        path, token = walk_sample(tree, p_rows, accept_candidates, g)
        i = path[0] if path else -1
        counts[(i + 1) * RV + (int(x[i]) if path else token)] += 1
    assert chi_square(counts, exact_outcomes(kind)).pvalue > 1e-3


def test_without_replacement_rows():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = without_replacement_rows(q, torch.tensor([3, 1, 0]))
    want = torch.tensor([[0.1, 0.2, 0.3, 0.4], [1 / 6, 2 / 6, 3 / 6, 0.0], [0.25, 0.0, 0.75, 0.0]])
    assert torch.allclose(rows, want)


def test_one_candidate_fixed_p_rule_is_the_exact_rule_draw_for_draw():
    """With one candidate the wrong rule equals the exact one (its docstring): same index and token per seed."""
    outcomes = set()
    # The global RNG is seeded only so that a rule wrongly drawing from it fails the same way every run.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for seed in range(60):
            g = torch.Generator().manual_seed(1000 + seed)
            p, q = (torch.softmax(1.5 * torch.randn(RV, generator=g), 0) for _ in range(2))
            x = torch.multinomial(q, 1, generator=g)
            exact = accept_candidates(x, p, q[None], torch.Generator().manual_seed(seed))
            fixed = accept_candidates_fixed_p(x, p, q[None], torch.Generator().manual_seed(seed))
            assert fixed == exact, seed
            outcomes.add(exact[0])
    assert outcomes == {0, -1}  # both acceptances and rejections were compared


@pytest.mark.parametrize("rule", [accept_candidates, accept_candidates_fixed_p])
def test_a_candidate_is_rejected_when_u_times_q_equals_p(rule):
    """Acceptance is u < p(x)/q(x), strict: for u uniform on [0, 1) that accepts with probability exactly p/q."""
    u = torch.rand(1, generator=torch.Generator().manual_seed(3)).item()  # the rule's first uniform for seed 3
    x = 2
    q = torch.full((1, RV), 0.5 / (RV - 1))
    q[0, x] = 0.5
    p = torch.full((RV,), (1 - u * 0.5) / (RV - 1))
    p[x] = u * 0.5  # exact in float32: u * q(x) == p(x)
    assert float(p[x]) == u * float(q[0, x])
    i, token = rule(torch.tensor([x]), p, q, torch.Generator().manual_seed(3))
    assert i == -1 and token != x  # rejected; the residual gives x no mass
    p[x] = torch.nextafter(p[x], torch.tensor(1.0))  # one float above the boundary: accepted
    assert rule(torch.tensor([x]), p, q, torch.Generator().manual_seed(3)) == (0, x)


@pytest.mark.parametrize("rule", [accept_candidates, accept_candidates_fixed_p])
def test_the_rules_draw_their_uniforms_on_the_distributions_device(rule):
    """Placement: on the meta device the rule fails reading its uniforms back; uniforms made on the CPU
    would get further and fail at the first probability read (the CPU-only stand-in for a GPU)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(RV, generator=g), 0).to("meta")
    q = torch.softmax(torch.randn(2, RV, generator=g), -1).to("meta")
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        rule(torch.tensor([1, 2]), p, q)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        rule(torch.tensor([1, 2]), p, q, torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- loop level

@pytest.fixture(scope="module")
def models():
    return tiny_random_model(V, seed=10, logit_scale=4.0), tiny_random_model(V, seed=11, logit_scale=4.0)


def pair_counts(target, make_drafter, runs, rule=accept_candidates, cfg=SAMPLING, trees=None):
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros(V * V)
    for _ in range(runs):
        drafter = make_drafter()
        if trees is not None:
            propose = drafter.propose_tree

            def logged(*args, _propose=propose, **kwargs):
                tree = _propose(*args, **kwargs)
                trees.append(tree)
                return tree
            drafter.propose_tree = logged
        out = tree_generate(target, drafter, PROMPT, 3, sampling=cfg, generator=g, rule=rule).tokens
        counts[out[0] * V + out[1]] += 1
    return counts


DRAFTERS = {
    "static": lambda d: StaticTreeDrafter(d, [3, 2]),
    "dynamic": lambda d: DynamicTreeDrafter(d, depth=2, topk=3, nodes=6),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_tree_sampling_loop_matches_exact_joint(models, kind):
    target, draft = models
    joint = exact_pair_distribution(target)
    assert 0.5 * np.abs(joint - exact_pair_distribution(draft)).sum() > 0.2  # the test has power
    trees = []
    counts = pair_counts(target, lambda: DRAFTERS[kind](draft), 3000, trees=trees)
    assert chi_square(counts, joint).pvalue > 0.001
    first = trees[0]  # the first iteration's: 3 + 6 nodes (static), the 6 best of 3 + 9 (dynamic)
    assert first.n == (9 if kind == "static" else 6) and first.max_depth == 2 and len(first.children(-1)) == 3
    assert (first.draws is not None) == (kind == "static")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_tree_sampling_loop_with_fixed_p_rule_is_detected(models, kind):
    target, draft = models
    joint = exact_pair_distribution(target)
    counts = pair_counts(target, lambda: DRAFTERS[kind](draft), 1000, rule=accept_candidates_fixed_p)
    assert chi_square(counts, joint).pvalue < 1e-6


@pytest.mark.slow
def test_tree_sampling_loop_with_top_k_and_temperature(models):
    target, draft = models
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=4)
    joint = exact_pair_distribution(target, cfg)
    trees = []
    counts = pair_counts(target, lambda: StaticTreeDrafter(draft, [6, 2]), 2000, cfg=cfg, trees=trees)
    assert counts[joint == 0].sum() == 0  # nothing outside the top-k is ever emitted
    assert chi_square(counts, joint).pvalue > 0.001
    # top_k leaves the draft 4 tokens with mass: the root gets 4 children, not 6, and none without mass.
    assert trees[0].max_depth == 2
    for tree in trees:
        if not tree.n:
            continue  # the budget left no room for a proposal
        assert len(tree.children(-1)) == 4
        assert all(float(tree.draws[c, tree.tokens_h[c]]) > 0 for c in range(tree.n))
