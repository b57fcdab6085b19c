"""The time model as pure functions: fitting pass times, pricing recorded iterations, calibrating the
loop's costs, and the k choice of the cost table. No model runs."""
import numpy as np
import pytest

from speclab.decoding.k_policy import CostModelK
from speclab.costs.time_model import CostTable, LoopCosts, PassModel, TimeModel, Trace, calibrate_loop, iid_speedup


def _rows(fn, lens, ctxs):
    n, c = np.meshgrid(lens, ctxs)
    return n.ravel(), c.ravel(), np.array([fn(a, b) for a, b in zip(n.ravel(), c.ravel())])


def test_pass_model_recovers_table_slope_and_prefill():
    jag = {1: 10.0, 2: 16.0, 3: 19.0, 4: 15.0}
    n, c, s = _rows(lambda n, c: jag[n] + 0.01 * n * c, [1, 2, 3, 4], [60, 70, 110, 120])
    pre_n = np.array([59, 60, 79, 80])
    pm = PassModel.fit(np.r_[n, pre_n], np.r_[c, np.zeros(4)], np.r_[s, 5.0 + 0.5 * pre_n])
    for k in (1, 2, 3, 4):
        assert pm.time(k, 200) == pytest.approx(jag[k] + 0.01 * k * 200)
    assert pm.prefill_time(100) == pytest.approx(55.0)
    assert pm.time(5, pm.ctx_ref) == pytest.approx(2 * pm.time(4, pm.ctx_ref) - pm.time(3, pm.ctx_ref))  # extrapolated


def test_pass_model_needs_passes():
    with pytest.raises(ValueError, match="no pass timings"):
        PassModel.fit(np.array([10]), np.array([0]), np.array([1.0]))


def _flat(step: float, per_token: float = 0.0) -> PassModel:
    """A pass of n tokens costs step + per_token * (n - 1), whatever the context; a prefill of n: n * step."""
    return PassModel({n: step + per_token * (n - 1) for n in range(1, 10)}, dict.fromkeys(range(1, 10), 0.0),
                     50.0, (0.0, step))


def _trace(proposed, new, fed, calls, prompt_len=10, model=True, lookup=False, merged=False):
    new = np.array(new)
    length = prompt_len + np.r_[0, np.cumsum(new)[:-1]]
    return Trace(prompt_len, np.array(proposed), new, length, np.array(fed), np.array(calls), model, lookup, merged)


def test_speculative_time_is_the_sum_of_its_iterations():
    tm = TimeModel(_flat(10.0, 1.0), _flat(2.0, 0.5), LoopCosts(rollback_s=0.1, bookkeeping_s=0.2))
    # Iteration 1: 3 proposals, all accepted (4 tokens); iteration 2 catches up 2 tokens, 1 accepted.
    tr = _trace([3, 3], [4, 2], [1, 2], [3, 3])
    d = tm.speculative(tr)
    assert d.parts["prefill_target"] == pytest.approx(90.0) and d.parts["prefill_draft"] == pytest.approx(18.0)
    assert d.parts["draft_steps"] == pytest.approx(6 * 2.0)
    assert d.parts["catch_up"] == pytest.approx(0.5)  # one extra fed token at 0.5 each
    assert d.parts["verify"] == pytest.approx(2 * 13.0)
    assert d.parts["rollback"] == pytest.approx(0.2) and d.parts["bookkeeping"] == pytest.approx(0.4)
    assert d.total == pytest.approx(90 + 18 + 12 + 0.5 + 26 + 0.6)
    assert tm.plain(10, 6).total == pytest.approx(100.0 + 5 * 10.0)
    assert tm.speedup(tr) == pytest.approx(150.0 / d.total)


def test_a_merged_prefill_prices_the_first_iteration_as_the_prefills():
    tm = TimeModel(_flat(10.0, 1.0), _flat(2.0, 0.5), LoopCosts(rollback_s=0.1, bookkeeping_s=0.2))
    # The draft's first call runs the 10-token prompt; the target's first pass the prompt and 3 proposals.
    tr = _trace([3, 3], [4, 2], [10, 2], [3, 3], merged=True)
    d = tm.speculative(tr)
    assert d.parts["prefill_target"] == pytest.approx(13 * 10.0) and d.parts["prefill_draft"] == pytest.approx(20.0)
    assert d.parts["draft_steps"] == pytest.approx((2 + 3) * 2.0)  # the cold call's two further steps, then three
    assert d.parts["catch_up"] == pytest.approx(0.5)  # only the second iteration's: the first is the prefill
    assert d.parts["verify"] == pytest.approx(13.0)  # only the second check
    assert d.total == pytest.approx(130 + 20 + 10 + 0.5 + 13 + 0.6)
    # One target pass fewer than prefill-then-verify: cheaper whenever a pass costs more than its tokens.
    apart = tm.speculative(_trace([3, 3], [4, 2], [1, 2], [3, 3]))
    assert d.parts["prefill_target"] + d.parts["verify"] == pytest.approx(
        apart.parts["prefill_target"] + apart.parts["verify"] + 4 * 10.0 - 13.0)
    # A hybrid whose model first drafts after a lookup iteration: that call is the draft's prefill.
    hy = _trace([2, 3], [3, 2], [0, 13], [0, 3], model=True, lookup=True, merged=True)
    assert tm.speculative(hy).parts["prefill_draft"] == pytest.approx(26.0)
    counted = Trace.from_counts(10, np.array([3, 3]), np.array([3, 1]), np.array([4, 2]), merged=True)
    assert counted.draft_fed.tolist() == [10, 2]


def test_calibrate_loop_leaves_a_merged_prefill_out_of_the_loop_scales():
    tm = TimeModel(_flat(10.0, 1.0), _flat(2.0, 0.5))
    tr = _trace([3, 3, 2], [4, 2, 1], [10, 2, 1], [3, 3, 2], merged=True)
    verify = 1.1 * tm.target.time(tr.proposed + 1, tr.length - 1)
    verify[0] = 500.0  # the prompt's pass: not a loop pass
    draft = 1.25 * ((tr.draft_calls - 1) * 2.0 + tm.draft.time(tr.draft_fed, 0))
    draft[0] = 300.0
    loop = calibrate_loop(tm, [tr], [draft], [verify], [np.zeros(3)], [draft + verify])
    assert loop.target_scale == pytest.approx(1.1) and loop.draft_scale == pytest.approx(1.25)


def test_time_model_repriced_at_other_step_times():
    tm = TimeModel(_flat(10.0, 1.0), _flat(2.0, 0.5), LoopCosts(rollback_s=0.1))
    tr = _trace([3, 3], [4, 2], [1, 2], [3, 3])
    same = tm.at_steps(10.0, 2.0, 10)
    assert same.speculative(tr).total == pytest.approx(tm.speculative(tr).total)
    # Both models twice as slow: every pass doubles, the loop's microseconds stay, the speed-up barely moves.
    slow = tm.at_steps(20.0, 4.0, 10)
    assert slow.target.time(4, 30) == pytest.approx(2 * tm.target.time(4, 30))
    assert slow.target.prefill_time(9) == pytest.approx(2 * tm.target.prefill_time(9))
    assert slow.plain(10, 6).total == pytest.approx(2 * tm.plain(10, 6).total)
    # Only the draft slower: speculation loses ground, plain decoding does not change.
    dear = tm.at_steps(10.0, 6.0, 10)
    assert dear.plain(10, 6).total == pytest.approx(tm.plain(10, 6).total)
    assert dear.speedup(tr) < tm.speedup(tr)
    assert dear.draft.time(2, 10) == pytest.approx(3 * tm.draft.time(2, 10))
    assert TimeModel(_flat(10.0), None).at_steps(5.0, None, 10).draft is None  # lookup: no draft to re-price


def test_lookup_iterations_cost_no_draft_and_no_draft_prefill():
    tm = TimeModel(_flat(10.0), None, LoopCosts(lookup_s=0.05))
    tr = _trace([2, 0, 3], [3, 1, 2], [0, 0, 0], [0, 0, 0], model=False, lookup=True)
    d = tm.speculative(tr)
    assert d.parts["prefill_draft"] == 0 and d.parts["draft_steps"] == 0
    assert d.parts["lookup"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="draft PassModel"):
        tm.speculative(_trace([2], [3], [1], [2]))


def test_calibrate_loop_recovers_in_loop_scales_and_overheads():
    tm = TimeModel(_flat(10.0, 1.0), _flat(2.0, 0.5))
    tr = _trace([3, 3, 2], [4, 2, 1], [1, 2, 1], [3, 3, 2])
    verify = 1.1 * tm.target.time(tr.proposed + 1, tr.length - 1)
    draft = 1.25 * ((tr.draft_calls - 1) * 2.0 + tm.draft.time(tr.draft_fed, 0))
    rollback = np.full(3, 0.3)
    total = draft + verify + rollback + 0.7
    loop = calibrate_loop(tm, [tr], [draft], [verify], [rollback], [total])
    assert loop.target_scale == pytest.approx(1.1) and loop.draft_scale == pytest.approx(1.25)
    assert loop.rollback_s == pytest.approx(0.3) and loop.bookkeeping_s == pytest.approx(0.7)


def test_cost_table_prices_the_catch_up_and_a_jagged_check():
    flat = CostTable({1: 0.3, 2: 0.3}, {k: 1.0 for k in range(1, 9)})
    catch = CostTable({1: 0.3, 2: 0.9}, {k: 1.0 for k in range(1, 9)})
    assert catch.iteration_cost(4, 0.9) > flat.iteration_cost(4, 0.9)
    assert flat.iteration_cost(4, 0.0) == pytest.approx(4 * 0.3 + 1.0)
    # A check that costs twice as much at k = 4 moves the choice off 4.
    jagged = CostTable({1: 0.1, 2: 0.1}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0, 5: 1.05, 6: 1.1})
    assert jagged.best_k(0.8, 1, 6) != 4
    assert CostTable({1: 0.1, 2: 0.1}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}).best_k(0.8, 1, 4) == 4
    assert flat.best_k(0.0, 1, 8) == 1
    with pytest.raises(ValueError, match="no verification cost"):
        jagged.best_k(0.5, 7, 8)


def test_cost_model_policy_uses_the_table():
    jagged = CostTable({1: 0.1, 2: 0.1}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 3.0, 5: 3.0, 6: 3.0})
    with_table = CostModelK(0.1, jagged.verify, k_min=1, k_max=6, decay=0.7, alpha0=0.9, table=jagged, estimator="iid")
    without = CostModelK(0.1, 1.0, k_min=1, k_max=6, decay=0.7, alpha0=0.9)
    assert with_table.k == 3 and without.k == 6


def test_iid_speedup_is_the_chapter_formula():
    assert iid_speedup(0.5, 2, 0.25, 1.5) == pytest.approx(1.75 / 2.0)


def test_positional_estimator_prices_bursts_that_one_alpha_averages_away():
    # Runs of agreement: either the first proposal is rejected, or all eight are accepted.
    table = CostTable({1: 0.5, 2: 0.55}, {k: 1.6 + 0.04 * k for k in range(1, 9)})
    p = CostModelK(0.5, table.verify, k_min=1, k_max=8, decay=0.95, table=table, estimator="positions")
    for proposed, accepted in [(8, 8), (8, 0), (8, 0)] * 6:
        p.update(proposed, accepted)
    surv = p.survival()
    # Past the first position the conditional acceptance is far higher than at it (a falling hazard) ...
    assert (surv[1:] / surv[:-1]).min() > surv[0] + 0.3
    # ... so a long run survives where one alpha says it would not.
    assert surv[7] > p.alpha ** 8
    best = max(range(1, 9), key=lambda k: (1 + surv[:k].sum()) / table.iteration_cost(k, 0.0, surv[k - 1]))
    assert p.k == best


def test_estimator_choice_is_checked():
    with pytest.raises(ValueError, match="estimator='bayes' is not allowed"):
        CostModelK(0.3, 1.0, estimator="bayes")


def _acc_rows(job: str, prompt: str = "p0") -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame([{"config_hash": job, "prompt_id": prompt, "kind": "code", "drafter": "model", "k_policy": "fixed",
                          "k": 2, "iteration": i, "proposed": 2, "accepted": 1, "new_tokens": 2, "prompt_len": 5,
                          "length": 5 + 2 * i, "draft_fed": 1, "draft_calls": 2, "draft_s": 0.01, "verify_s": 0.02,
                          "rollback_s": 0.0, "total_s": 0.03} for i in range(3)])


def test_runs_of_two_jobs_never_merge_into_one_trace():
    import pandas as pd

    from speclab.costs.planning import traces

    assert len(traces(pd.concat([_acc_rows("a"), _acc_rows("b", "p1")]))) == 2
    with pytest.raises(ValueError, match="acceptance rows of 2 jobs describe one run"):
        traces(pd.concat([_acc_rows("a"), _acc_rows("b")]))  # a plan remade in the same campaign


def test_time_model_analysis_calibrates_on_one_named_plan_job():
    import pandas as pd

    from analysis.inputs import AnalysisError
    from analysis.time_model import calibration_job

    timing = pd.DataFrame({"config_hash": ["a", "a", "b"], "prompt_id": ["p0", "p1", "p0"]})
    acc = pd.concat([_acc_rows("a"), _acc_rows("b"), _acc_rows("held", "p9")])
    with pytest.raises(AnalysisError, match=r"holds timing results of 2 jobs \(a, b\).*time_model.calibration_job"):
        calibration_job(timing, acc, None, "c")
    with pytest.raises(AnalysisError, match="time_model.calibration_job='z' is not a timing job of campaign 'c'"):
        calibration_job(timing, acc, "z", "c")
    t, a = calibration_job(timing, acc, "b", "c")
    assert set(t.config_hash) == {"b"} and set(a.config_hash) == {"b", "held"}  # the other plan's runs left out
    # Another timing job's runs on prompts outside the calibration (a stage-all job on every prompt) stay:
    # they are the held-out prompts' acceptance runs to replay.
    both = pd.concat([acc, _acc_rows("a", "p7")])
    t, a = calibration_job(timing, both, "b", "c")
    assert set(zip(a.config_hash, a.prompt_id)) == {("b", "p0"), ("held", "p9"), ("a", "p7")}
    t, a = calibration_job(timing[timing.config_hash == "a"], acc, None, "c")
    assert set(t.config_hash) == {"a"}


def test_a_run_measured_by_two_jobs_is_replayed_once():
    import pandas as pd

    from analysis.time_model import one_job_per_run

    acc = pd.concat([_acc_rows("b", "p7"), _acc_rows("a", "p7"), _acc_rows("b", "p8")])
    kept = one_job_per_run(acc)
    assert sorted(set(zip(kept.config_hash, kept.prompt_id))) == [("a", "p7"), ("b", "p8")]
    assert len(kept) == 6   # three iterations each: nothing of a kept job is lost
