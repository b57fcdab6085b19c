"""The greedy replay (speclab.drafting.replay) makes the loop's own decisions: on tiny fp32 models every replayed
iteration equals the speculative loop's (length, proposals, accepted, new tokens, the draft's catch-up
and calls) for fixed k, adaptive policies, every drafter, EOS inside the output and tight budgets;
and an off-by-one in the replay's cap, budget, EOS or catch-up rule is caught by these cases."""
import numpy as np
import pytest
import torch

import speclab.drafting.replay as rp
from speclab.decoding.acceptance import accept_sample
from speclab.decoding.drafters import HybridDrafter, PromptLookupDrafter
from speclab.decoding.k_policy import ConditionedK, CostModelK, FixedK, HeuristicK
from speclab.decoding.loop import plain_greedy, speculative_generate
from speclab.models.loading import draft_variant, tiny_random_model
from speclab.drafting.replay import ReplayDrafter, replay
from speclab.drafting.replay_check import compare
from speclab.drafting.replay_reference import greedy_reference
from speclab.decoding.sampling import GREEDY
from speclab.decoding.step import run_speculative
from speclab.costs.time_model import CostTable

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [[5], [3, 17, 9, 41, 2], [60, 1, 1, 1, 7, 22, 33, 12, 8]]
CPU = torch.device("cpu")
TABLE = CostTable({1: 0.3, 2: 0.35}, {k: 1.05 + 0.05 * k for k in range(1, 11)})

DRAFTERS = {
    "model": lambda d: d,
    "lookup": lambda d: PromptLookupDrafter(),
    "lookup_2gram": lambda d: PromptLookupDrafter(max_ngram=2, min_ngram=2),
    "hybrid": lambda d: HybridDrafter(d),
    "hybrid_min_match3": lambda d: HybridDrafter(d, min_match=3),
}
POLICIES = {
    "k1": lambda: 1,
    "k2": lambda: 2,
    "k4": lambda: 4,
    "heuristic": lambda: HeuristicK(),
    "cost_model_k_min0": lambda: CostModelK(0.3, 1.0, k_min=0, decay=0.7),
    "cost_model_table": lambda: CostModelK(0.3, 1.0, k_min=1, decay=0.7, table=TABLE, estimator="positions"),
    # k from the label alone: a wrong label in the replay changes its proposal counts at once.
    "conditioned": lambda: ConditionedK(lambda label: FixedK({0: 1, 1: 2, 2: 3, 3: 5}.get(label, 4))),
    "conditioned_cost": lambda: ConditionedK(lambda label: CostModelK(0.3, 1.0, k_min=0, decay=0.7)),
}


@pytest.fixture(scope="module")
def pair():
    """A target and a draft of its first 3 of 4 layers: they agree often, not always (mixed accept/reject)."""
    target = tiny_random_model(64, seed=3, num_layers=4, logit_scale=2.0)
    return target, draft_variant(target, "layers:3", CPU)


def _ids(prompt):
    return torch.tensor([prompt])


def _check(target, draft, prompt, drafter, policy, max_new, eos=None, ref=None):
    """Loop and replay of one configuration; the agreement and the replay."""
    ref = ref or greedy_reference(target, draft, _ids(prompt), max_new, eos)
    run = speculative_generate(target, DRAFTERS[drafter](draft), _ids(prompt), max_new, k=POLICIES[policy](),
                               eos_token_id=eos)
    replayed = ref.replay(DRAFTERS[drafter](draft), POLICIES[policy]())
    return compare(replayed, run), replayed


@pytest.mark.parametrize("prompt", PROMPTS)
def test_replay_equals_the_loop_for_every_drafter_and_policy(pair, prompt):
    target, draft = pair
    ref = greedy_reference(target, draft, _ids(prompt), 40)
    assert ref.output == plain_greedy(target, _ids(prompt), 40).tokens
    for drafter in DRAFTERS:
        for policy in POLICIES:
            agreement, replayed = _check(target, draft, prompt, drafter, policy, 40, ref=ref)
            assert agreement.exact, (drafter, policy, agreement)
            assert replayed.complete
    # The cases are not trivial: proposals are accepted and rejected, and lookup iterations happen.
    model = ref.replay(draft, 4)
    assert 0 < model.accepted < model.proposed
    assert any(s.source == "lookup" for s in ref.replay(HybridDrafter(draft), 4).steps)


def test_useless_and_perfect_drafts(tiny_pair):
    target, useless = tiny_pair
    perfect = draft_variant(target, "copy", CPU)
    for draft in (useless, perfect):
        ref = greedy_reference(target, draft, _ids(PROMPTS[1]), 30)
        for policy in ("k1", "k4", "heuristic", "cost_model_k_min0"):
            agreement, replayed = _check(target, draft, PROMPTS[1], "model", policy, 30, ref=ref)
            assert agreement.exact, (policy, agreement)
    assert replayed.acceptance_rate == 1.0


def _eos_cases(target, draft, prompt, n=30):
    """EOS ids taken from the plain output at several positions (early, inside accepted blocks, late)."""
    plain = plain_greedy(target, _ids(prompt), n).tokens
    return sorted({plain[i] for i in (0, 3, 6, 11, 17, 25)})


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "perfect", "lookup", "hybrid"])
def test_eos_inside_the_output(pair, drafter):
    target, draft = pair
    d = draft_variant(target, "copy", CPU) if drafter == "perfect" else draft
    name = "model" if drafter == "perfect" else drafter
    cut_inside = 0
    for prompt in PROMPTS:
        for eos in _eos_cases(target, d, prompt):
            ref = greedy_reference(target, d, _ids(prompt), 30, eos)
            assert ref.output[-1] == eos and len(ref.output) < 30
            for policy in ("k2", "k4", "heuristic", "cost_model_table"):
                agreement, replayed = _check(target, d, prompt, name, policy, 30, eos, ref=ref)
                assert agreement.exact, (prompt, eos, policy, agreement)
                assert replayed.complete
                last = replayed.steps[-1]
                cut_inside += last.new_tokens < last.accepted + 1  # EOS among the accepted proposals
    if drafter == "perfect":  # lookup can propose an EOS only after one in the prompt
        assert cut_inside  # the EOS rule cut an iteration's accepted tokens short


def test_accepted_past_eos_needs_the_lookahead(pair):
    """A perfect draft's last iteration accepts proposals past the EOS: without the target's tokens
    there the replay says it is incomplete (and undercounts), with them it is exact."""
    target, _ = pair
    perfect = draft_variant(target, "copy", CPU)
    prompt = PROMPTS[1]
    eos = plain_greedy(target, _ids(prompt), 30).tokens[6]
    run = speculative_generate(target, perfect, _ids(prompt), 30, k=8, eos_token_id=eos)
    full = greedy_reference(target, perfect, _ids(prompt), 30, eos)
    short = greedy_reference(target, perfect, _ids(prompt), 30, eos, lookahead=0)
    assert len(short.target) < len(full.target)
    assert compare(full.replay(perfect, 8), run).exact
    cut = short.replay(perfect, 8)
    assert not cut.complete and cut.tokens == run.tokens
    assert cut.steps[-1].accepted < run.iterations[-1].accepted


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "lookup", "hybrid"])
def test_tight_token_budgets(pair, drafter):
    target, draft = pair
    perfect = draft_variant(target, "copy", CPU)
    capped = 0
    for d in (draft, perfect):
        for prompt in PROMPTS:
            for max_new in range(1, 10):
                ref = greedy_reference(target, d, _ids(prompt), max_new)
                for policy in ("k1", "k4", "heuristic", "cost_model_k_min0"):
                    agreement, replayed = _check(target, d, prompt, drafter, policy, max_new, ref=ref)
                    assert agreement.exact, (prompt, max_new, policy, agreement)
                    assert len(replayed.tokens) == max_new
                    capped += policy == "k4" and any(s.k < 4 for s in replayed.steps)
    # The proposal cap bound. (At one row the cap keeps every block within the budget: the budget
    # only ends the run; a shifted limit is caught in test_an_off_by_one_in_the_replay_is_caught.)
    assert capped


def _differing(monkeypatch, name, fake, cases):
    """How many of ``cases`` (drafter, policy, max_new, eos) differ from the loop once ``speclab.drafting.replay.<name>``
    is replaced by ``fake``."""
    target = tiny_random_model(64, seed=3, num_layers=4, logit_scale=2.0)
    drafts = {"model": draft_variant(target, "copy", CPU), "lookup": None}
    results = []
    for drafter, policy, max_new, eos in cases:
        d = drafts[drafter]
        ref = greedy_reference(target, d, _ids(PROMPTS[2]), max_new, eos)
        with monkeypatch.context() as m:
            m.setattr(rp, name, fake)
            try:
                results.append(not _check(target, d, PROMPTS[2], drafter, policy, max_new, eos, ref=ref)[0].exact)
            except (ValueError, RuntimeError):  # the shifted rule ran past the target's tokens or stalled
                results.append(True)
    return sum(results)


def test_an_off_by_one_in_the_replay_is_caught(monkeypatch, one_torch_thread):
    """The budget and EOS cases above exercise the cap, the budget, the EOS rule and the catch-up:
    each of these rules shifted by one makes some of them fail."""
    cases = [("model", "k4", n, None) for n in (3, 6, 7, 9)] + [("lookup", "k4", n, None) for n in (5, 9, 13)]
    plain = plain_greedy(tiny_random_model(64, seed=3, num_layers=4, logit_scale=2.0), _ids(PROMPTS[2]), 30).tokens
    eos_cases = [(d, "k4", 30, plain[i]) for d in ("model", "lookup") for i in (3, 6, 11)]
    real_finish, real_seen = rp.finish, rp.draft_seen_at_start
    assert _differing(monkeypatch, "proposal_cap", lambda m, g: m - g, cases)
    assert _differing(monkeypatch, "proposal_cap", lambda m, g: m - g - 2, cases)
    assert _differing(monkeypatch, "finish", lambda t, n, lim, e: real_finish(t, n, lim + 1, e), cases)
    assert _differing(monkeypatch, "finish", lambda t, n, lim, e: real_finish(t, n, lim - 1, e), cases)

    def eos_late(tokens, length, limit, eos):  # the EOS token's position taken one too far
        final, done = real_finish(tokens, length, limit, eos)
        return (min(final + 1, limit), done) if eos.intersection(tokens) else (final, done)

    assert _differing(monkeypatch, "finish", eos_late, eos_cases)
    assert _differing(monkeypatch, "finish", lambda t, n, lim, e: real_finish(t, n, lim, set()), eos_cases)
    assert _differing(monkeypatch, "draft_seen_at_start", lambda n, merged=True: real_seen(n, merged) + 1, cases)
    assert not _differing(monkeypatch, "finish", real_finish, cases + eos_cases)  # the harness itself agrees


@pytest.mark.parametrize("merge_prefill", [True, False])
def test_trace_and_run_steps(pair, merge_prefill):
    """The replay's Trace has the loop's columns, and a Run's steps (one row) compare like its iterations."""
    target, draft = pair
    prompt = PROMPTS[1]
    ref = greedy_reference(target, draft, _ids(prompt), 40)
    for drafter in ("model", "hybrid"):
        run = speculative_generate(target, DRAFTERS[drafter](draft), _ids(prompt), 40, k=HeuristicK(),
                                   merge_prefill=merge_prefill)
        tr = ref.replay(DRAFTERS[drafter](draft), HeuristicK(), merge_prefill).trace()
        for col, attr in (("proposed", "k"), ("new_tokens", "new_tokens"), ("length", "length"),
                          ("draft_fed", "draft_fed"), ("draft_calls", "draft_calls")):
            assert np.array_equal(getattr(tr, col), [getattr(it, attr) for it in run.iterations]), col
        assert tr.uses_model and tr.uses_lookup == (drafter == "hybrid") and tr.merged == merge_prefill
        # The draft's first call runs what it has not seen: the whole prompt (merged) or its last token.
        if drafter == "model":
            assert tr.draft_fed[0] == (len(prompt) if merge_prefill else 1)
    steps = run_speculative(target, draft, [_ids(prompt)[0]], 40, 3, GREEDY, None, None, accept_sample, None)
    agreement = compare(greedy_reference(target, draft, _ids(prompt), 40).replay(draft, 3), steps)
    assert agreement.exact and agreement.agree == len(steps.steps)


def test_a_difference_is_counted_and_located(pair):
    target, draft = pair
    ref = greedy_reference(target, draft, _ids(PROMPTS[1]), 40)
    run = speculative_generate(target, draft, _ids(PROMPTS[1]), 40, k=2)
    wrong = list(ref.draft)
    i = next(s.length - len(ref.prompt) for s in ref.replay(draft, 2).steps[3:] if s.accepted)  # judged, accepted
    wrong[i] = (wrong[i] + 1) % 64  # as if the teacher-forced pass had broken a near-tie the other way
    agreement = compare(replay(ref.prompt, ref.target, wrong, draft, 2, 40), run)
    assert not agreement.exact and agreement.differ >= 1 and agreement.first_difference is not None
    assert "accepted" in agreement.detail
    assert agreement.agree + agreement.differ >= len(run.iterations)


def test_bad_inputs():
    with pytest.raises(ValueError, match="kind="):
        ReplayDrafter("medusa")
    with pytest.raises(ValueError, match="choice at each"):
        replay([1, 2], [3, 4], None, ReplayDrafter("model"), 2, 2)
    with pytest.raises(ValueError, match="end before EOS"):
        replay([1, 2], [3, 4], None, ReplayDrafter("prompt_lookup"), 2, 5)  # 2 tokens for a budget of 5
    assert replay([1, 2], [3, 4], None, ReplayDrafter("prompt_lookup"), 2, 5, eos_token_id=4).tokens == [3, 4]
