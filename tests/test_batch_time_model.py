"""The batch time model: batch 1 is the batch-1 time model, a small batch priced by hand, the loop's
costs recovered, and the batch analysis predicting a synthetic batch stage it was made from."""
import json

import numpy as np
import pandas as pd
import pytest

from analysis.batch import (acceptance_traces, batch_costs, batch_speedups, error_metrics, model_error, time_model_runs,
                            with_time_model)
from speclab.costs.batch_time_model import BatchPassModel, BatchTimeModel, BatchTrace, calibrate_batch_loop
from speclab.costs.time_model import PARTS, LoopCosts, PassModel, TimeModel, Trace

BOOT = {"samples": 200, "seed": 0, "level": 0.95}


def _jagged(step: float, slope: float) -> PassModel:
    """Pass times that are not a line in n, depend on the context, and a prefill with an intercept."""
    table = {1: step, 2: 1.6 * step, 3: 1.4 * step, 4: 1.9 * step}
    return PassModel(table, {n: slope * n for n in table}, 60.0, (0.3, 0.01))


def _trace(prompt_len, proposed, accepted, new) -> Trace:
    return Trace.from_counts(prompt_len, np.array(proposed), np.array(accepted), np.array(new))


def test_a_batch_of_one_is_the_batch_1_time_model():
    tm = TimeModel(_jagged(1.0, 0.01), _jagged(0.4, 0.002),
                   LoopCosts(target_scale=1.1, draft_scale=1.3, rollback_s=0.05, bookkeeping_s=0.07))
    tr = _trace(40, [3, 3, 3, 2], [3, 0, 1, 2], [4, 1, 2, 3])  # catch-up of 2 after the first iteration
    # Timed at batch 1 only, or at more batch sizes: a batch of one is priced by batch 1's pass models.
    wider = BatchTimeModel(BatchPassModel({1: tm.target, 4: _jagged(3.0, 0.05)}),
                           BatchPassModel({1: tm.draft, 4: _jagged(1.0, 0.01)}), tm.loop)
    for bm in (BatchTimeModel.of(tm), wider):
        bt = BatchTrace.lockstep([tr])
        assert bt.batch_size == 1 and list(bt.rows) == [1, 1, 1, 1]
        spec, ref = bm.speculative(bt).parts, tm.speculative(tr).parts
        assert spec == ref and set(spec) == set(PARTS)
        assert bm.plain(40, [tr.tokens]).parts == tm.plain(40, tr.tokens).parts
        assert bm.speedup(bt, [tr.tokens]) == tm.speedup(tr)


def _linear(step: float, per_token: float, sizes=(1, 4)) -> BatchPassModel:
    """A pass over r rows x n tokens costs step + per_token * r * n at any context (timed at ``sizes``)."""
    return BatchPassModel({b: PassModel({n: step + per_token * b * n for n in range(1, 10)},
                                        dict.fromkeys(range(1, 10), 0.0), 50.0, (0.0, 1.0)) for b in sizes})


def test_a_batch_of_two_priced_by_hand():
    # Row a: 2 proposals accepted (3 tokens), then 1 rejected (1 token); row b: 1 of 2 accepted (2 tokens).
    a, b = _trace(10, [2, 2], [2, 0], [3, 1]), _trace(12, [2], [1], [2])
    bt = BatchTrace.lockstep([a, b])
    assert list(bt.rows) == [2, 1] and bt.prompt_len == 12 and bt.batch_size == 2
    assert list(bt.new_tokens) == [5, 1] and list(bt.draft_fed) == [1, 2] and list(bt.length) == [12, 13]
    target, draft = _linear(1.0, 0.1).with_prefill(0.5, 0.01), _linear(0.2, 0.05).with_prefill(0.1, 0.002)
    bm = BatchTimeModel(target, draft, LoopCosts(rollback_s=0.03, bookkeeping_s=0.04))
    d = bm.speculative(bt).parts
    # Timed at 1 and 4 rows: 2 rows sit a third of the way along, which is the line itself here.
    assert target.time(2, 3, 0) == pytest.approx(1.0 + 0.1 * 2 * 3)
    assert d["prefill_target"] == pytest.approx(0.5 + 0.01 * 2 * 11)
    assert d["prefill_draft"] == pytest.approx(0.1 + 0.002 * 2 * 11)
    assert d["verify"] == pytest.approx((1.0 + 0.1 * 2 * 3) + (1.0 + 0.1 * 1 * 3))
    assert d["draft_steps"] == pytest.approx(2 * (0.2 + 0.05 * 2) + 2 * (0.2 + 0.05 * 1))
    assert d["catch_up"] == pytest.approx(0.05 * 1 * 1)  # the second iteration's draft call runs 2 tokens, not 1
    assert d["rollback"] == pytest.approx(0.06) and d["bookkeeping"] == pytest.approx(0.08)
    # Plain: one prefill of 2 rows x 12 (it makes each row's first token), then steps 1..3 for tokens 2..4
    # of row a; row b (2 tokens) is in step 1 only.
    plain = bm.plain(12, [4, 2]).parts
    assert plain["prefill_target"] == pytest.approx(0.5 + 0.01 * 2 * 12)
    assert plain["verify"] == pytest.approx((1.0 + 0.1 * 2) + 2 * (1.0 + 0.1))
    with pytest.raises(ValueError, match="by_rows"):
        BatchPassModel({})


def test_calibrate_batch_loop_recovers_scales_and_per_iteration_costs():
    bm = BatchTimeModel(_linear(1.0, 0.1), _linear(0.2, 0.05))
    bts = [BatchTrace.lockstep([_trace(10, [2, 2], [2, 0], [3, 1]), _trace(12, [2], [1], [2])]),
           BatchTrace.lockstep([_trace(11, [2, 2, 2], [0, 1, 2], [1, 2, 3])])]
    cols = {c: [] for c in ("iterations", "draft", "verify", "rollback", "iter")}
    for bt in bts:
        p, n = bm.speculative(bt).parts, len(bt.proposed)
        draft, verify = 1.6 * (p["draft_steps"] + p["catch_up"]) / n, 1.2 * p["verify"] / n
        for c, v in zip(cols, (n, draft, verify, 0.01, draft + verify + 0.01 + 0.02)):
            cols[c].append(v)
    loop = calibrate_batch_loop(bm, bts, *(np.array(v) for v in cols.values()))
    assert loop.target_scale == pytest.approx(1.2) and loop.draft_scale == pytest.approx(1.6)
    assert loop.rollback_s == pytest.approx(0.01) and loop.bookkeeping_s == pytest.approx(0.02)


# A synthetic batch stage made by a known batch time model, and the acceptance runs of its prompts.
PROMPTS = {"a": (30, [2, 2, 2, 2], [2, 0, 1, 2], [3, 1, 2, 3]), "b": (24, [2, 2, 2], [1, 2, 2], [2, 3, 3]),
           "c": (27, [2, 2, 2, 2, 2], [0, 0, 1, 0, 2], [1, 1, 2, 1, 3])}
BLOCKS = [["a"], ["b"], ["c"], ["a", "b"], ["b", "c"], ["c", "a"]]


def _acceptance() -> pd.DataFrame:
    rows = []
    for p, (_, proposed, accepted, new) in PROMPTS.items():
        for i, (x, y, z) in enumerate(zip(proposed, accepted, new)):
            rows.append({"config_hash": "acc", "prompt_id": p, "k": 2, "drafter": "model", "k_policy": "fixed",
                         "do_sample": False, "iteration": i, "proposed": x, "accepted": y, "new_tokens": z})
    return pd.DataFrame(rows)  # no prompt_len column: lengths come from the runs of one prompt alone


def _batch_stage(truth: BatchTimeModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    passes = pd.DataFrame([{"pair": "p", "config_hash": "job", "measure": "pass", "batch_size": b, "model": role,
                            "pass_len": n, "context_len": 50, "median_s": float(m.time(b, n, 50))}
                           for role, m in (("target", truth.target), ("draft", truth.draft))
                           for b in (1, 2) for n in range(1, 5)])
    runs = []
    for block, ids in enumerate(BLOCKS):
        traces = [_trace(*PROMPTS[p]) for p in ids]
        bt, tokens, ctx = BatchTrace.lockstep(traces), [t.tokens for t in traces], max(PROMPTS[p][0] for p in ids)
        spec, plain = truth.speculative(bt), truth.plain(ctx, tokens)
        n, p = len(bt.proposed), spec.parts
        common = {"pair": "p", "config_hash": "job", "measure": "run", "batch_size": len(ids), "block": block,
                  "prompt_ids": ",".join(ids), "do_sample": False, "new_tokens": sum(tokens), "context_len": ctx,
                  "layout_share": 0.0, "masked_share": 0.0, "identical_to_plain": True}
        runs.append({**common, "arm": "plain", "k": 0, "wall_s": plain.total, "prefill_s": plain.parts["prefill_target"],
                     "tokens_per_s": sum(tokens) / plain.total, "ratio_to_adjacent_plain": 1.0,
                     "row_acceptance": json.dumps([None] * len(ids)), "acceptance_rate": np.nan, "iterations": 0,
                     "draft_s_per_iter": 0.0, "verify_s_per_iter": 0.0, "rollback_s_per_iter": 0.0, "iter_s": 0.0})
        runs.append({**common, "arm": "speculative", "k": 2, "wall_s": spec.total,
                     "prefill_s": p["prefill_target"] + p["prefill_draft"], "tokens_per_s": sum(tokens) / spec.total,
                     "ratio_to_adjacent_plain": plain.total / spec.total,
                     "row_acceptance": json.dumps([0.7] * len(ids)), "acceptance_rate": 0.7, "iterations": n,
                     "draft_s_per_iter": (p["draft_steps"] + p["catch_up"]) / n, "verify_s_per_iter": p["verify"] / n,
                     "rollback_s_per_iter": p["rollback"] / n,
                     "iter_s": (spec.total - p["prefill_target"] - p["prefill_draft"]) / n})
    return pd.DataFrame(runs), passes


@pytest.fixture
def synthetic():
    target = BatchPassModel({b: PassModel({n: 0.05 + 0.01 * b * n + 0.004 * (n == 3) for n in range(1, 5)},
                                          dict.fromkeys(range(1, 5), 0.0), 50.0, (0.0, 1.0)) for b in (1, 2)})
    draft = BatchPassModel({b: PassModel({n: 0.02 + 0.003 * b * n for n in range(1, 5)},
                                         dict.fromkeys(range(1, 5), 0.0), 50.0, (0.0, 1.0)) for b in (1, 2)})
    truth = BatchTimeModel(target.with_prefill(0.01, 0.002), draft.with_prefill(0.004, 0.0007),
                           LoopCosts(target_scale=1.2, draft_scale=1.5, rollback_s=0.001, bookkeeping_s=0.003))
    runs, passes = _batch_stage(truth)
    return runs, passes, acceptance_traces(_acceptance(), runs)


def test_batch_analysis_predicts_the_world_it_was_made_from(synthetic):
    runs, passes, traces = synthetic
    assert traces[("b", 2)].prompt_len == 24 and traces[("a", 2)].tokens == 9
    per_run = time_model_runs(runs, passes, traces)
    assert len(per_run) == len(BLOCKS)  # every block predicted from the others
    np.testing.assert_allclose(per_run.predicted_time_model, per_run.measured, rtol=1e-9)
    assert (per_run.predicted_no_loop - per_run.measured).abs().min() > 0.01  # the loop's costs matter here
    np.testing.assert_allclose(per_run.target_scale, 1.2) and np.testing.assert_allclose(per_run.draft_scale, 1.5)
    speed = with_time_model(batch_speedups(runs, batch_costs(passes), BOOT), per_run)
    errors = model_error(speed, per_run)
    assert list(errors.batch_size) == [1, 2]
    assert (errors.time_model_mae < 1e-9).all() and (errors.formula_mae > 0.01).all()
    assert (errors.error_ratio < 1e-6).all()


def test_a_run_is_never_calibrated_on_its_own_times(synthetic):
    runs, passes, traces = synthetic
    before = time_model_runs(runs, passes, traces).set_index("block").predicted_time_model
    own = runs.block == 4
    cols = ["prefill_s", "draft_s_per_iter", "verify_s_per_iter", "rollback_s_per_iter", "iter_s"]
    runs.loc[own, cols] = runs.loc[own, cols] * 10
    after = time_model_runs(runs, passes, traces).set_index("block").predicted_time_model
    assert after[4] == pytest.approx(before[4], rel=1e-12)
    assert after[3] != pytest.approx(before[3], rel=1e-3)  # block 4 does calibrate the other blocks of its B


def test_runs_without_matching_acceptance_runs_are_not_predicted(synthetic):
    runs, passes, traces = synthetic
    del traces[("c", 2)]
    per_run = time_model_runs(runs, passes, traces)
    # Blocks 2, 4, 5 hold c; block 3 is left with no other block of 2 rows to calibrate on.
    assert set(per_run.block) == {0, 1}
    none = time_model_runs(runs, passes, {})
    assert none.empty
    errors = model_error(with_time_model(batch_speedups(runs, batch_costs(passes), BOOT), none), none)
    assert errors.time_model_mae.isna().all() and errors.formula_mae.notna().all()
    assert error_metrics(errors, "c")["p"]["mae_time_model"] == {"B1": None, "B2": None}
